"""``python -m offset_ledger.devstack fetch|up|down|status|env|jars``."""

from __future__ import annotations

import argparse
import sys

from offset_ledger import devstack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offset_ledger.devstack",
        description="Start and stop the local stack: Apache Kafka (KRaft), PostgreSQL, Spark's Kafka connector.",
    )
    parser.add_argument("command", choices=["fetch", "up", "down", "status", "env", "jars"],
                        help="jars: print the spark.jars value for the installed PySpark's connector")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            devstack.fetch()
        elif args.command == "jars":
            print(devstack.spark_jars_option())
        elif args.command == "up":
            started = devstack.up()
            for key, value in started.env().items():
                print(f"export {key}='{value}'")
        elif args.command == "down":
            devstack.down()
            print("[devstack] stopped")
        else:
            info = devstack.status()
            if info is None:
                print("[devstack] not running", file=sys.stderr)
                return 1
            if args.command == "status":
                print(f"kafka    {info.bootstrap_servers} (pid {info.kafka_pid})")
                if info.sasl_bootstrap_servers:
                    print(f"  sasl   {info.sasl_bootstrap_servers} (SASL_PLAINTEXT, {devstack.SASL_MECHANISM}, "
                          f"user {devstack.SASL_USERNAME})")
                print(f"postgres {info.postgres_dsn} (pid {info.postgres_pid})")
                print(f"jars     {info.spark_jars}")
            else:
                for key, value in info.env().items():
                    print(f"export {key}='{value}'")
    except devstack.StackError as exc:
        print(f"devstack: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
