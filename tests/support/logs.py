"""Log text as real launchers print it, shared by the tests that parse it."""

from pathlib import Path

#: Whole outputs kept as they were printed (long lines, trailing blanks and all).
_TEXT = Path(__file__).parent / "logtext"

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


# What torch prints where it fails on a GPU, which no test here can make it do: each as its
# source formats it (the numbers, paths and times are ours). The tests that replay them say
# they are fixtures.

#: c10/cuda/CUDACachingAllocator.cpp's message, raised as torch.OutOfMemoryError (torch 2.5+).
CUDA_OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 1.53 GiB. GPU 0 has a total capacity of 79.19 GiB"
    " of which 1.12 GiB is free. Including non-PyTorch memory, this process has 78.05 GiB"
    " memory in use. Of the allocated memory 75.31 GiB is allocated by PyTorch, and 1.94 GiB"
    " is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try"
    " setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See"
    " documentation for Memory Management "
    " (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)

#: What a rank of an NCCL job prints when a collective outlives its timeout, as
#: ProcessGroupNCCL.cpp (torch 2.5+) logs it before its watchdog aborts the process
#: (`terminate called ...`, then SIGABRT). The lines of one rank, without torchrun's prefix.
NCCL_WATCHDOG_LINES = (
    "[rank1]:[E1125 10:21:07.418870812 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught"
    " collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=4198400,"
    " NumelOut=4198400, Timeout(ms)=600000) ran for 600031 milliseconds before timing out.",
    "[rank1]:[E1125 10:21:07.419160533 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg)"
    " Rank 1] Exception (either an error or timeout) detected by watchdog at work: 812, last"
    " enqueued NCCL work: 812, last completed NCCL work: 811.",
    "[rank1]:[E1125 10:21:08.614204077 ProcessGroupNCCL.cpp:684] [Rank 1] Some NCCL operations"
    " have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU"
    " operations might run on corrupted/incomplete data.",
    "[rank1]:[E1125 10:21:08.614231412 ProcessGroupNCCL.cpp:698] [Rank 1] To avoid data"
    " inconsistency, we are taking the entire process down.",
    "terminate called after throwing an instance of 'c10::DistBackendError'",
    "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated"
    " with exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL("
    "SeqNum=812, OpType=ALLREDUCE, NumelIn=4198400, NumelOut=4198400, Timeout(ms)=600000) ran"
    " for 600031 milliseconds before timing out.",
    "Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/"
    "ProcessGroupNCCL.cpp:635 (most recent call first):",
    "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 (0x7f1c2d96b5e8 in"
    " /venv/lib/python3.11/site-packages/torch/lib/libc10.so)",
    "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::"
    "duration<long, std::ratio<1l, 1000l> > >) + 0x23d (0x7f1bd3a5e6ad in"
    " /venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so)",
    "frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0xc98 (0x7f1bd3a60a38 in"
    " /venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so)",
)

#: A CUDA kernel's failed assert (aten/src/ATen/native/cuda/Indexing.cu: an embedding
#: lookup of a token id past the vocabulary), printed by the kernel, then the RuntimeError
#: torch raises at the next CUDA call (c10/cuda/CUDAException.cpp's wording).
DEVICE_ASSERT_KERNEL_LINE = (
    "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1553: indexSelectLargeIndex: block:"
    " [97,0,0], thread: [64,0,0] Assertion `srcIndex < srcSelectDimSize` failed."
)
DEVICE_ASSERT_MESSAGE = (
    "CUDA error: device-side assert triggered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the"
    " stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


# Real torchrun 2.13 output, 2 ranks on one node (gloo), its paths cut: torchrun's
# `[default1]:` and, inside it on a traceback, torch's excepthook's `[rank1]: `.

#: Rank 1 raised ValueError at step 20; rank 0 then failed on the closed connection.
TORCHRUN_RAISED = (_TEXT / "torchrun_raised.txt").read_text()
#: Rank 1 exited 0 at step 20 while rank 0 trained: rank 0 failed on the closed connection,
#: and torchrun's summary lists rank 0 only.
TORCHRUN_EARLY_EXIT = (_TEXT / "torchrun_early_exit.txt").read_text()
#: A Hugging Face Trainer script (tests/support/frameworks/hf_plain.py, 20 steps, logging
#: every 5) under `torchrun --nproc-per-node=2 --tee=3`, as torchrun printed it: its
#: progress bar's `\r` ends a line, and a dict follows a bar on the same line.
TORCHRUN_HF_TRAINER = (_TEXT / "torchrun_hf_trainer.txt").read_text()
