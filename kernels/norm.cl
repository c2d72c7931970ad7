// norm.cl: layer_norm, rms_norm and batch_norm forward and backward.
