"""From file to arrays: the GGUF file, the model's configuration and tensor plan, the weight matrices and
the expert streamer that reads routed experts on demand.

Reading order (dataflow): ``gguf_file`` (the header, parsed here) → ``config`` (GGUF keys → :class:`Config`)
→ ``tensors`` (which tensor is which, shapes checked as llama.cpp's ``check_tensor_dims``) → ``load``
(:class:`ModelFile`: file + config + plan) → ``weights`` (:class:`Matrix` views) → ``expert_slices`` and
``streamer`` (routed experts read through a byte-budgeted cache) → ``route_trace`` (the streamer's routing log) →
``packing`` (the matrices' packed second copies, and the walk over them that ``--emulate=ggml``'s column layout uses) →
``stand_in`` (one trunk layer of each kind: what a first run's second process compiles the kernels on). ``output_path`` is the one rule for every file a command writes; ``meminfo`` reads MemAvailable; ``malloc`` is the refimpl command's allocator policy (freed large blocks reused).

May import: ``refimpl.errors`` and ``kernels``. Nothing else of refimpl: the model, the loops and the
oracle build on this folder, never the other way round.
"""
