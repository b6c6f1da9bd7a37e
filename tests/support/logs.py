"""Log text as real launchers print it, shared by the tests that parse it."""

#: torchrun's end-of-run summary after rank 3 (node 1, local rank 1) was SIGKILLed.
TORCHRUN_FAILURE = """\
[default0]:step 10 loss 1.0
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_23:17:29
  host      : localhost
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 10402)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 10402
"""
