"""Lamport all-reduce building blocks: protocol, PTX primitives, mailboxes,
publish and consumer kernels. The protocol is written down in
:mod:`kernels.lamport.protocol`."""
