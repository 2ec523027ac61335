"""NCCL's collectives as a model: the cluster a run stands for, NCCL's own choice of algorithm, protocol and
channels, the time it takes, and nccl-tests' conventions.

* :mod:`.system`: the cluster (nodes, GPUs and NICs per node, their generations, GPUDirect RDMA, the GPU-NIC
  path), and the rates and latencies the hardware's published figures give it;
* :mod:`.tuning`: NCCL's tuning model (``src/graph/tuning.cc``, ``search.cc``, ``enqueue.cc``), which NCCL uses to
  choose an algorithm and protocol by size, and the channels it runs;
* :mod:`.cost`: the predicted time of a collective: NCCL's latency structure, and the bandwidth of the slowest
  stage the data crosses (the wire, PCIe, host staging, the socket link, NVLink);
* :mod:`.nccl_tests`: nccl-tests' binaries, sizes, counts and bus-bandwidth factors, and its table.

Pure: imports nothing live. ``docs/validation.md`` names the source of every constant.
"""
