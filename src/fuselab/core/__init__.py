"""The bottom layer: what both the references (:mod:`fuselab.reference`) and the fused ops (:mod:`fuselab.ops`)
build on, importing nothing else of fuselab but :mod:`fuselab.backend`.

* vocabularies, each defined once: :mod:`fuselab.core.rope_layouts` (RoPE layouts: names, shapes, axes),
  :mod:`fuselab.core.activations` (activation names, kernel codes, what a backward keeps),
  :mod:`fuselab.core.reductions` (``sum``/``mean``).
* :mod:`fuselab.core.checks`: argument checks that raise ``TypeError``/``ValueError`` naming the argument, and the
  memory overlap of tensors an op writes in place.
* :mod:`fuselab.core.rope_math`: RoPE's inverse frequencies and amplitude (base, scaling), and cos/sin tables.
* :mod:`fuselab.core.device`: facts of a device that plans read (SM count, DRAM bandwidth, TMA), offsets.
* :mod:`fuselab.core.compile`: ``torch.compile`` without torch's own deprecation notices.
* :mod:`fuselab.core.flags`: the values a command-line flag or config field may take (checked where parsed).
* :mod:`fuselab.core.console`: the console's width, and output streams whose failure never stops the work.
"""
