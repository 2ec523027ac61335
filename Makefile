# One-command set-up for everything: `make test` and `make experiment` run
# `make setup` first, so on a fresh Debian 12 machine (as root) they are all a
# user types. `make setup` is idempotent.

SHELL := /bin/bash
.DEFAULT_GOAL := help

# Debian's python3 so that the venv sees Debian's Mininet package.
SYSTEM_PYTHON ?= /usr/bin/python3
VENV ?= .venv
BIN := $(VENV)/bin
DEB_PACKAGES := mininet openvswitch-switch iperf3 tcpdump ethtool iputils-ping iproute2 procps openmpi-bin python3-mpi4py \
	python3-venv python3-dev gcc openssh-server openssh-client
VENV_STAMP := $(VENV)/.installed
# The library emu mpirun preloads into every rank for the fabric's latency (emulator/emulation/mpi/mpi_latency.c).
LATENCY_LIBRARY := $(VENV)/lib/ef-mpi-latency.so
TOPO ?= bigraph:upper=4,lower=4,hosts_per_switch=2
POLICY ?= bigraph
PYTEST_ARGS ?=

.PHONY: help setup debian-packages openvswitch venv test unit integration lint controller experiment bench soak clean

help:
	@echo "make test         set up, then lint + unit tests + integration tests (root)"
	@echo "make experiment   set up, then run the default experiment"
	@echo "make setup        Debian packages, Open vSwitch, .venv (idempotent)"
	@echo "make controller TOPO=<spec> POLICY=<policy>   run the SDN controller in the foreground"
	@echo "make bench        fidelity and performance ratios, measured side by side"
	@echo "make soak         set up, then the soak and crash-consistency tests at full length (root; about 30 min)"
	@echo "make clean        remove bridges, links and processes this project left behind"

setup: debian-packages openvswitch venv $(LATENCY_LIBRARY)

# openssh-server is for the integration tests' namespace "servers" (tests/integration/cluster_servers.py), each
# running an sshd of its own. Its package would start a machine-wide sshd through invoke-rc.d: a policy-rc.d
# that refuses every start (exit 101) is put in place for the install if none exists, and removed after it.
# An sshd that starts in the machine's network namespace during the install all the same is ended by its pid.
POLICY_RC_D := /usr/sbin/policy-rc.d
debian-packages:
	@if [ "$$(id -u)" != 0 ]; then echo "make setup: run as root (sudo make ...)" >&2; exit 2; fi
	@missing=$$(for p in $(DEB_PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:" $$missing; \
		machine_sshds() { for p in $$(pgrep -x sshd); do \
			[ "$$(readlink /proc/$$p/ns/net)" = "$$(readlink /proc/$$$$/ns/net)" ] && echo $$p; done; }; \
		before=" $$(machine_sshds | tr '\n' ' ')"; \
		made_policy=; if [ ! -e $(POLICY_RC_D) ]; then \
			made_policy=1; trap 'rm -f $(POLICY_RC_D)' EXIT; trap 'exit 130' INT TERM HUP; \
			printf '#!/bin/sh\nexit 101\n' > $(POLICY_RC_D); chmod 755 $(POLICY_RC_D); \
		fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; status=$$?; \
		[ -z "$$made_policy" ] || rm -f $(POLICY_RC_D); \
		for p in $$(machine_sshds); do case "$$before" in *" $$p "*) ;; *) \
			echo "stopping the sshd the install started (pid $$p)"; kill $$p;; esac; done; \
		exit $$status; \
	fi

# Works without the openvswitch kernel module: switches then use the
# userspace datapath (chosen per run by emulator.emulation.machine.system.choose_datapath).
# The glibc tunable keeps ovs-vswitchd's allocator from trimming its heap
# around every batch of packet buffers (measured: with 32000-byte frames 91%
# of its system calls were brk and it used a whole core; the first network
# after a start ran slow; docs/fidelity.md). It goes into Debian's
# /etc/default/openvswitch-switch too, which the systemd units read, so an
# Open vSwitch that apt or a reboot starts has it. A running ovs-vswitchd
# without it is restarted, unless bridges exist (someone's network is up).
OVS_GLIBC_TUNABLES := glibc.malloc.trim_threshold=268435456
OVS_DEFAULTS := /etc/default/openvswitch-switch
OVS_CTL := /usr/share/openvswitch/scripts/ovs-ctl
openvswitch: debian-packages
	@grep -qs '^GLIBC_TUNABLES=$(OVS_GLIBC_TUNABLES)$$' $(OVS_DEFAULTS) || \
		{ sed -i '/^GLIBC_TUNABLES=/d' $(OVS_DEFAULTS) 2>/dev/null; \
		  echo 'GLIBC_TUNABLES=$(OVS_GLIBC_TUNABLES)' >> $(OVS_DEFAULTS); }
	@pid=$$(cat /var/run/openvswitch/ovs-vswitchd.pid 2>/dev/null); \
	if ! ovs-vsctl --timeout=5 show >/dev/null 2>&1; then \
		echo "starting Open vSwitch"; \
		GLIBC_TUNABLES=$(OVS_GLIBC_TUNABLES) $(OVS_CTL) start --system-id=random >/dev/null 2>&1 || true; \
	elif [ -n "$$pid" ] && ! tr '\0' '\n' < /proc/$$pid/environ 2>/dev/null | grep -qx 'GLIBC_TUNABLES=$(OVS_GLIBC_TUNABLES)'; then \
		if [ -z "$$(ovs-vsctl --timeout=5 list-br)" ]; then \
			echo "restarting Open vSwitch with GLIBC_TUNABLES=$(OVS_GLIBC_TUNABLES) (docs/fidelity.md)"; \
			GLIBC_TUNABLES=$(OVS_GLIBC_TUNABLES) $(OVS_CTL) restart --system-id=random >/dev/null 2>&1 || true; \
		else \
			echo "warning: ovs-vswitchd runs without GLIBC_TUNABLES=$(OVS_GLIBC_TUNABLES) and bridges exist;" \
				"restart it when they are gone (make setup does) or the first network may run slow" >&2; \
		fi; \
	fi
	@ovs-vsctl --timeout=10 show >/dev/null || { echo "Open vSwitch did not start: see /var/log/openvswitch/" >&2; exit 1; }

venv: $(VENV_STAMP)

$(VENV_STAMP): requirements.txt setup.cfg pyproject.toml | debian-packages
	$(SYSTEM_PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.txt
	# Chakra's protobuf schema only; its other dependencies are notebook tooling.
	$(BIN)/pip install -q --disable-pip-version-check --no-deps mlc-chakra==1.0.0
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

$(LATENCY_LIBRARY): emulator/emulation/mpi/mpi_latency.c $(VENV_STAMP)
	gcc -O2 -Wall -Wextra -Werror -shared -fPIC -o $@.tmp $< -ldl -lpthread && mv $@.tmp $@

lint: venv
	$(BIN)/ruff check emulator controllers tests
	$(BIN)/mypy emulator controllers
	$(BIN)/lint-imports --no-logo --no-cache

unit: venv
	$(BIN)/pytest -q -n auto tests/unit $(PYTEST_ARGS)

integration: setup
	$(BIN)/emu clean
	$(BIN)/pytest -q -m integration tests/integration $(PYTEST_ARGS)

test: setup lint unit integration

controller: setup
	$(BIN)/emu controller --topology "$(TOPO)" --routing "$(POLICY)"

experiment: setup
	$(BIN)/emu run experiments/default.yaml

bench: setup
	$(BIN)/emu bench

# The long versions of two integration files (`make test` runs them short: 3 rounds, 2 crash trials):
# 50 bring-ups per soak variant, 20 random SIGKILLs of `emu run`, and the runner's rebuild after a broken network;
# and the long fault tests `make test` leaves out (tests/integration/soak_only.py says why each).
# Every census and trial goes to results/soak/*.jsonl. First the hostile-input suite and the fuzz tests at
# HOSTILE_EXAMPLES generated inputs per test (`make test`: a few hundred per reader, the same ones every run;
# here new ones every run, tests/unit/fuzz_support.py).
SOAK_ROUNDS ?= 50
CRASH_TRIALS ?= 20
HOSTILE_EXAMPLES ?= 1000
soak: setup
	EF_HOSTILE_EXAMPLES=$(HOSTILE_EXAMPLES) $(BIN)/pytest -q -n auto tests/unit/test_hostile_inputs.py tests/unit/test_fuzz_*.py $(PYTEST_ARGS)
	$(BIN)/emu clean
	EF_SOAK_ROUNDS=$(SOAK_ROUNDS) EF_CRASH_TRIALS=$(CRASH_TRIALS) EF_SOAK_LONG=1 EF_MPI_STARTS=100 $(BIN)/pytest -q -s \
		-m integration tests/integration/test_soak.py tests/integration/test_crash_consistency.py \
		tests/integration/test_mpi_starts.py \
		tests/integration/test_faults.py::test_sigint_then_sigkill_to_emu_run_then_a_clean_restart_keeps_finished_cells \
		tests/integration/test_cluster_run.py::test_a_server_lost_mid_cell_fails_that_cell_and_the_run_resumes \
		tests/integration/test_collectives.py::test_any_size_process_groups_a_pytorch_trace_and_a_language_model_replay_with_their_data \
		'tests/integration/test_controller.py::test_controller[bigraph-bigraph-link_down]' \
		'tests/integration/test_mpirun.py::test_the_bundled_benchmark_runs_with_correct_data_and_leaves_a_results_folder' \
		tests/integration/test_cluster_run.py::test_an_mpi_cell_of_emu_run_runs_on_the_cluster \
		$(PYTEST_ARGS)

clean:
	@if [ -x $(BIN)/emu ]; then $(BIN)/emu clean; fi
