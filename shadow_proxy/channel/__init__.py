"""What the serving process and the tap worker share: the hand-off frames and the
control messages. Pure: no sockets, no aiohttp; both sides import it, neither
side imports the other."""
