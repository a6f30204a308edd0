"""Pod networking for husk-cri: pinned network namespaces, the CNI invoker, the default CNI config."""
