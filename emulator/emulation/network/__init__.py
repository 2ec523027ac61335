"""Network bring-up: Mininet with Open vSwitch and HTB-shaped links from the topology model, and the controller as a
child process."""
