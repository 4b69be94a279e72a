"""`pagedchat bench quality`: what quantization does to the model's outputs, against the float reference."""
