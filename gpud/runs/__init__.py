"""Running trainers on this node, and across nodes from node 0. Seven rooms, lowest first;
each may import only the rooms before it (tests/unit/test_import_contracts.py holds it):

- `process`: the processes of one node's part: the shim that owns them (`shim`), finding
  and ending them by their tags (`procs`).
- `diagnosis`: what a run says and why it failed: its captured log (`attempt_log`,
  `logread`), its lines parsed (`logparse`), the flight recorder (`flight`, `fr_analyze`),
  the cause of a failure (`causes`) and the advice for a known one (`hints`).
- `placement`: which GPUs (`gpus`: the choice; `leases`: who holds what) and which
  MASTER_PORT (`ports`) a part gets; simulated GPUs' load from real ranks (`simload`).
- `state`: a run's records and their state changes (`book`: the one owner), one node's
  part of an attempt (`part`), and the checkpoint a new attempt resumes from (`checkpoints`).
- `multinode`: the gang across nodes as node 0 runs it (`gang`, `decide`), node 0's link to
  the others (`peers`, `peer_stops`), a node's watch on node 0 (`coordinator_watch`), and
  elastic attempts (`elastic`).
- `health`: what trainers tell gpud while a run runs and what gpud makes of it: the
  trainer messages and output coming in (`intake`), the telemetry kept (`telemetry`), the
  verdict (`verdict`, `stragglers`), hangs (`hangs`) and goodput (`goodput`).
- `lifecycle`: the supervisor that ties them together, from a launch to the last check
  (`supervisor`), its read-only views (`queries`), runs gpud did not start (`attached`) and
  what is done after a part ends (`aftermath`).
"""
