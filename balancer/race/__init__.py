"""``race``: the Redis lease race of ``001_552f7490fd2b6e08.txt``, as a coordinator.

001, step by step (numbers as in the document), for one node:

1. Per partition, a timer of one normal lease time (``RaceTimes``), reset whenever a grab
   notification for that partition is heard from anyone. When it fires, the node publishes a grab
   notification (clearing first a grab mark older than the maximum lease time: its winner died).
2. Every node that hears a notification waits ``race_wait`` (``times``: (n - 1)·d for the
   owner, (n + 1/2)·d for the others, and why that reading) ...
3. ... then ``HSETNX`` the grab hash: the first to set it wins.
3b. An owner that did not win stops processing gracefully (``on_handoff``: the runtime stops the
   pump after the event in hand and its final checkpoint, then calls ``release``), clears its
   allocation field and publishes an allocated notification.
4. The winner reads the allocation hash: if another node is processing the partition, it waits
   for that node's allocated notification, at most the maximum shutdown time.
5. The winner marks the allocation hash with itself and starts processing.
6. After the minimum lease grab time the winner clears its grab mark, so the partition can be
   challenged again.

What 001 leaves open, and how it is closed here (in the part named, where it is one part's job):

- A partition's first timer fires at the same point of the first normal lease time on every node
  (a hash of its id), so challenges are spread over the lease time and a node that joins races
  for one partition at a time (``challenge``).
- Of several challenges heard at once, a node sends one HSETNX to take a partition at a time and
  reads its load again before each, so an idle node does not win a whole burst (``steps``).
- Pub/sub is fire and forget: a node that missed a notification never raced. Each cycle reads
  both hashes and repairs from them: a partition this node processes whose grab hash names
  another node was lost in a race it did not hear (step 3b, late); one whose allocation names
  another node is already processed there (stopped at once); one whose allocation field is
  empty (the store restarted without persistence) gets it back (``HSETNX``), so the race forms
  again around the same owners instead of moving partitions.
- A node publishes only while subscribed, and not just after it subscribed again; a race still
  waiting when the subscription broke is given up (``subscription``), and a race's HSETNX is
  refused when the store restarted since the subscription began, noticed or not (the store's
  generation, ``backend.RaceBackend.grab``): a racer whose wait ended in the moment before its
  subscription saw the break would otherwise win, on the empty store, a race the owner had won.
- A loser's allocation field is cleared only while it still names the loser: after the maximum
  shutdown time the winner has already written it.
- Ownership records still fence checkpoints and show owners: a node takes the record of a
  partition it starts, renews those it holds each cycle, and releases one it hands over (``leases``).
- ``holds()``: a node that has not reached the race store for the maximum shutdown time stops
  processing (it could not hear that it lost, and a winner starts after that time at the latest).
- Controls: a drained node never tries to win and challenges its own partitions so others take
  them; a partition pinned to a node is won by that node at once and tried by nobody else.
- A clean stop (``release_all``) clears this node's fields, releases its records and publishes a
  grab notification for each of its partitions, so they are raced for now, not a lease time later.

``coordinator.RaceCoordinator`` composes the parts: ``node`` (who the node is and what it holds,
which the others read), ``subscription``, ``challenge`` (step 1), ``steps`` (2 to 6), ``leases``;
``times`` has the spans and the wait formula, ``backend`` and ``redis`` the race's store, ``build``
its command-line options; ``workers.wiring.race`` builds it.
"""
