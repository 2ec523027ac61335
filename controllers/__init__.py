"""OpenFlow controller for the emulator: a thin os-ken (or Ryu) app over pure routing logic.

* :mod:`controllers.core` -- the controller's state and decisions (which
  entries each switch gets, what a port-down changes, what the port counters
  mean), pure Python with no os-ken import, unit-tested with fakes.
* :mod:`controllers.compat` -- the one import shim: os-ken if present, Ryu
  otherwise.
* :mod:`controllers.eflops_controller` -- the app: attaches datapaths, sends
  what the core decides, polls port statistics.
"""
