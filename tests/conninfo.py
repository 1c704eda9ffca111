#!/usr/bin/python3
"""The test cluster's connection, from libpq's environment, in the form a consumer reads.

  conninfo.py libpq  ->  host=... port=... user=... password=... dbname=...  (each value quoted)
  conninfo.py jdbc   ->  jdbc:postgresql://localhost:PORT/DB?user=...&password=...  (encoded)

pg_virtualenv's password, a database or a user name may hold any character; pasted into either
form as they are, a space, a quote, an & or a / would end the value early.
"""
import getpass
import os
import sys
import urllib.parse

env = os.environ
port = env.get("PGPORT", "5432")
user = env.get("PGUSER") or getpass.getuser()
database = env.get("PGDATABASE") or user
password = env.get("PGPASSWORD")

if sys.argv[1:] == ["libpq"]:
    def quoted(value):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"

    parts = {"host": env.get("PGHOST", "/var/run/postgresql"), "port": port, "user": user, "dbname": database}
    if password:
        parts["password"] = password
    print(" ".join(f"{k}={quoted(v)}" for k, v in parts.items()))
elif sys.argv[1:] == ["jdbc"]:
    # JDBC has no Unix sockets: the same server over TCP to localhost.
    query = {"user": user} | ({"password": password} if password else {})
    print(f"jdbc:postgresql://localhost:{port}/{urllib.parse.quote(database, safe='')}?{urllib.parse.urlencode(query)}")
else:
    sys.exit("usage: conninfo.py libpq|jdbc")
