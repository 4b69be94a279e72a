"""Running the model on a device: device and dtype choice, the KV pool, input preparation, forward, sampling."""
