"""The host agents: one process per rank replaying a schedule over real TCP, their connections, control protocol,
launcher and fleet, and a server's accelerator interconnect."""
