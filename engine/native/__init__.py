"""CPU native code: C kernels built once per machine (attention, fused ops) and the oneDNN-prepacked linears."""
