"""What makes the training step fast without changing what it computes: compiled layers, CUDA
graphs, packing, chunked log-probs, tiling."""
