"""`tropical fidelity`: the same trace slice through the real server and through the simulator."""
