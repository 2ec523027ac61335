"""Workloads as schedules: training iterations (ResNet-50 data parallel, Megatron-LM language models) and Chakra
traces."""
