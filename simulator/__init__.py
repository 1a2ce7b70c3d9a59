"""A discrete-event simulator of an ECHO-2 fleet: the project's own pure cores (capacity model and
activation, chains, the hysteresis controller) driven against modelled workers, network and learner, to
reproduce the paper's systems results at its own scale. Pure: no Django, no Redis, no network; it imports
only the pure cores (marketplace.core.provisioning and .controller, dataplane.broadcast.chains). docs/simulator.md
describes the model."""
