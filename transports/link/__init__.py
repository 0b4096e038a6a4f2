"""Links: many sessions of one process over one connection, both ends, whatever carries their messages.

From the bottom up:

- `_envelope`: the message of a link, many sessions' frames each numbered on its own channel.
- `_state`: what each end keeps of its channels, with no I/O (numbers, acknowledgements, resumption).
- `_client`: a client's end of a link, its channels and their ends; `_registry`: the links an event loop holds.
- `_batch`: a pool's steps over a link as one ``steps`` entry (client side), through a `SteppingLink` seam.
- `_host_sessions`: the sessions of a link, server side: admitted to slots, built, ended.
- `_loan`: a link's socket lent to its lone session's thread: what the host needs of a loan, and the thread's side.
- `_host`: the server end of a link: its sessions' frames dispatched, stepped in batches, answered.

The carriers are the transports' own: `transports.websocket` and `transports.http`.
"""
