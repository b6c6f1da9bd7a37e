"""Kubernetes, as a node's daemon sees it: which pod each GPU belongs to (`pods`), from the
kubelet's pod-resources API (`podresources`) and the processes' cgroups."""
