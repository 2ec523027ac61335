"""The pure model: topologies, routing, fabric profiles and latency, schedules and their timing, the projection to
paper scale."""
