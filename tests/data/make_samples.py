"""Regenerate the Chakra sample traces in this directory (run from the repository root).

``chakra_ar.<rank>.et`` for ranks 0..3: a compute node, an ALL_REDUCE of 64 KiB,
another compute node and an ALL_REDUCE of 1 MiB, written with the chakra
protobuf and varint length prefixes. ``msccl_ring4.xml`` was written by hand.
"""

from __future__ import annotations

import os

from chakra.schema.protobuf import et_def_pb2 as pb
from emulator.schedule.chakra import coll_node, write_trace

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    for rank in range(4):
        nodes = [
            pb.Node(id=1, name="fwd", type=pb.COMP_NODE, duration_micros=100),
            coll_node(2, "allreduce_grad_a", pb.ALL_REDUCE, 64 * 1024, deps=[1]),
            pb.Node(id=3, name="bwd", type=pb.COMP_NODE, duration_micros=200, data_deps=[2]),
            coll_node(4, "allreduce_grad_b", pb.ALL_REDUCE, 1 << 20, deps=[3]),
        ]
        write_trace(os.path.join(HERE, f"chakra_ar.{rank}.et"), nodes)


if __name__ == "__main__":
    main()
