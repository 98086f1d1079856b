"""The algorithm a researcher changes: the policy losses and the advantages, pure functions over tensors."""
