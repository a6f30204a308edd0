"""husk-cri: the CRI v1 server (pods, containers, images, CNI, streaming, state). May import shim/ and runtime/."""
