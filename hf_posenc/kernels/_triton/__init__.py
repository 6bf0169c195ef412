"""Triton plumbing shared by the kernel families (TAPA, TAPE), one module per concern:

* ``launch``: launch planning: the :class:`~.launch.Target` a launch is planned for, :class:`~.launch.LaunchSpec`
  (one planned launch, with the constexprs its kernel derives with ``triton.heuristics``), the heuristics rules
  the kernels share (padded widths, dot precision) and the cheap once-per-kernel reads planning relies on;
* ``layout``: how launches cover the work: tiles and tile tables, the decode threshold and split-K factor, and
  :class:`~.layout.ForwardLayout` (prefill and split-K decode);
* ``fastmath``: the special-function-unit math the kernels use (``exp2``, ``log2``, trigonometry in turns);
* ``blocks``: the device-side pieces both families' kernels are made of: tile loads and stores, visibility and
  key / query block schedules, GQA-packed rows, the online-softmax step, atomic adds;
* ``combine``: the two small kernels both families launch: the split-K combine and the backward's row dot.

Compiling a launch plan for a GPU that is not there, and reading the binaries, is development tooling:
``hf_posenc.kernels.dev``. A JIT function's starting line number is part of Triton's cache key, so moving one
changes the keys of every binary that calls it: refresh the compile lane's seed after such a move.
"""
