"""TPU kernels (Pallas): splash attention for training and scoring, ragged decode attention."""
