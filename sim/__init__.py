"""SimPy model of a PP/TP deployment (installed as fastpp.sim)."""
