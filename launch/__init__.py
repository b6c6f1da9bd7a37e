"""What a run is and how to start it: run specs, command builders, auto-tuning, gpuctl."""
