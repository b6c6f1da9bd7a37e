"""gpuctl: the scripting front end of gpud. Every verb takes --json."""
