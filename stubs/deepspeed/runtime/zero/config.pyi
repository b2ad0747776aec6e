class DeepSpeedZeroConfig:
    stage: int
    reduce_bucket_size: int
    round_robin_gradients: bool
    param_persistence_threshold: int
