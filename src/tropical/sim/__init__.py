"""Discrete-event cluster simulator driving the sched policies on a virtual clock."""
