"""Runs that heal themselves (issue 21): GPUs gpud finds unsafe are quarantined, an operator
can drain a GPU or the node, and neither gets new work; `rules` says what is unsafe (pure),
`holds` keeps the quarantines and drains (in the store, so they survive a restart)."""
