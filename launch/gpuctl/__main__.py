"""`python -m launch.gpuctl` is `gpuctl`."""

from launch.gpuctl.main import main

main()
