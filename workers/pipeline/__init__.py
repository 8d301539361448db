"""The Spark pipeline over the landing area (``manage.py runpipeline``).

``schema`` (what a landing file holds, for Spark), ``transforms`` (pure DataFrame-to-DataFrame
functions: no I/O, tested on inline frames), ``job`` (the streaming query and its edges: the file
source, the Parquet results, the Django summary through ``summary``), ``spark`` (the session).
"""
