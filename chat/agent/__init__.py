"""The reply loop, the model client and what the loop needs of a workspace."""
