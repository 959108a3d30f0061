"""Whole DLRM training steps the lab times side by side (``fuselab bench dlrm``): the model they share described
without an implementation (:mod:`.model`), stock PyTorch's step (:mod:`.stock`) and TorchRec's and FBGEMM's
(:mod:`.peers`). fuselab's own steps come from ``fuselab.dlrm`` (the suite builds them)."""
