"""The live edges: the network (Mininet, Open vSwitch, tc), the controller process, host agents and their fleet, replays, MPI runs, fault injection, cleanup."""
