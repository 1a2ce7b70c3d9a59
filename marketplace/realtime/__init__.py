"""The agents' websocket: the Channels consumer, the channel layer, the assembly of groups sent in parts, and the per-
socket cache of a worker's running job."""
