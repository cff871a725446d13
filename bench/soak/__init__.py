"""The compressed-month soak: the mission's daily shape, compressed in time, on one machine.

    python -m bench soak [--minutes 30] [--rate 116] [--burst-rate 10000] [--burst-seconds 42]
                         [--burst-every 150] [--retention 2m] [--sample 10] [--out DIR]

A private redis-server, a private PostgreSQL cluster (``--shared-postgres``: a database on the
tests' server instead), ``dispatcher run`` (2 processes) with retention of ``--retention`` for
every finished state and a pass every few seconds, worker processes with no-op handlers, a
schedule that fires every second, and a producer offering ``--rate`` jobs/s with a burst of
``--burst-rate`` every ``--burst-every`` seconds (10% delayed up to ``--max-delay``, 1% failing:
retried once, then dead-lettered). Every ``--sample`` seconds it records the DB's size (every table
and index of the schema, partitions included), the jobs row count and its dead rows, Redis
``used_memory``, the dispatcher's and the workers' RSS, enqueue-to-start p50/p99, and the ingest,
drain and prune rates. It writes ``samples.csv``, ``soak.md`` (the table and the verdict),
``soak.png`` (with matplotlib) and ``soak.json`` to ``--out``, and prints the verdict line
(verdict.py): each resource is flat when its level between bursts (the median of the samples whose
ingest and drain are near the steady rate) has not grown by more than ``--tolerance`` (10%) from the
second third to the last (the thirds' means, the issue's first rule, are shown beside it: they
depend on where the bursts fall); bursts drain as fast at the end (the median time from a burst's
start to the next quiet sample, within ``--latency-tolerance`` plus a sample); latency did not
drift when the quiet samples' median p50 and p99 are within ``--latency-tolerance`` (50%, plus 5
ms) of the second third's; and every enqueued job ran. Exit status 0 when all held.
``python -m bench soak-judge DIR`` judges a run's ``samples.csv`` again with this verdict.
The producer sends what the stack takes: a deficit of more than a second of the offered rate is
dropped (and counted), so a machine that cannot take the bursts shows smaller ones.
"""
