// softmax.cl: softmax, log_softmax and fused cross-entropy over rows of strided views.
