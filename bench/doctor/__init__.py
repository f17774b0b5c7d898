"""Speed and correctness of the audit: `check` against `collect_env`, the ownership hash cache, remedies
applied as printed on real environments, and which GPUs CUDA_VISIBLE_DEVICES leaves."""
