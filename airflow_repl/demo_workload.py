"""The demo's publisher database: a small shop schema, seed data and a live OLTP workload
(inserts, updates of keys and non-key columns, cascading key updates, deletes)."""

from __future__ import annotations

import random
import threading
import time

import psycopg

from airflow_repl.engine.postgres import raw_sql

SCHEMA = """
CREATE TABLE customers (
    id          bigint PRIMARY KEY,
    name        text NOT NULL,
    email       text UNIQUE,
    city        text,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE products (
    sku         text PRIMARY KEY,
    name        text NOT NULL,
    price       numeric(10,2) NOT NULL,
    tags        text[],
    attrs       jsonb
);
CREATE TABLE orders (
    id          bigint PRIMARY KEY,
    customer_id bigint NOT NULL REFERENCES customers,
    status      text NOT NULL,
    ordered_at  timestamptz NOT NULL,
    total       numeric(12,2),
    note        text
);
CREATE TABLE order_lines (
    order_id    bigint REFERENCES orders ON DELETE CASCADE,
    line_no     int,
    sku         text NOT NULL REFERENCES products ON UPDATE CASCADE,
    qty         int NOT NULL,
    price       numeric(10,2) NOT NULL,
    PRIMARY KEY (order_id, line_no)
);
"""

SEED = """
INSERT INTO customers (id, name, email, city)
SELECT g, 'Customer ' || g, 'c' || g || '@example.com', (ARRAY['Lisbon','Porto','Dallas','Austin','Oslo'])[1 + g %% 5]
FROM generate_series(1, %(customers)s) g;
INSERT INTO products (sku, name, price, tags, attrs)
SELECT 'SKU-' || lpad(g::text, 6, '0'), 'Product ' || g, (g %% 500) + 0.99,
       ARRAY['t' || (g %% 7), 't' || (g %% 11)], jsonb_build_object('weight', g %% 40, 'color', 'c' || (g %% 9))
FROM generate_series(1, %(products)s) g;
INSERT INTO orders (id, customer_id, status, ordered_at, total)
SELECT g, 1 + (g * 7919) %% %(customers)s, 'new', now() - (g || ' minutes')::interval, 0
FROM generate_series(1, %(orders)s) g;
INSERT INTO order_lines (order_id, line_no, sku, qty, price)
SELECT o, l, 'SKU-' || lpad((1 + (o * 31 + l) %% %(products)s)::text, 6, '0'), 1 + (o + l) %% 5, 9.99
FROM generate_series(1, %(orders)s) o, generate_series(1, 1 + o %% 4) l;
"""


def create(conninfo: str, *, customers: int = 20000, products: int = 2000, orders: int = 40000) -> None:
    with psycopg.connect(conninfo) as conn:
        conn.execute(SCHEMA)
        params = {"customers": customers, "products": products, "orders": orders}
        for statement in filter(str.strip, SEED.split(";")):
            conn.execute(statement, params)
        conn.execute("ANALYZE")


MAX_ERRORS = 50


class Workload:
    """A writer of random shop transactions: in the background (``start()``/``stop()``, which
    returns how many committed) or in the caller's thread (``run(n)``)."""

    def __init__(self, conninfo: str, *, seed: int = 7, pause: float = 0.002) -> None:
        self.conninfo = conninfo
        self.rng = random.Random(seed)
        self.pause = pause
        self.committed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-workload", daemon=True)

    def start(self) -> Workload:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.committed

    def run(self, transactions: int) -> int:
        """Commit ``transactions`` transactions in the calling thread; returns how many committed."""
        self._run(limit=transactions)
        return self.committed

    def _run(self, limit: int | None = None) -> None:
        with psycopg.connect(self.conninfo) as conn:
            (next_order,) = raw_sql.one_row(conn.execute("SELECT coalesce(max(id), 0) + 1 FROM orders"))
            conn.commit()
            while (
                not self._stop.is_set() and (limit is None or self.committed < limit) and len(self.errors) < MAX_ERRORS
            ):  # a broken database ends the run, not a loop
                try:
                    with conn.transaction():
                        next_order = self._one(conn, next_order)
                    self.committed += 1
                except psycopg.errors.UniqueViolation:
                    pass  # a random key collided; the transaction rolled back as a whole
                except psycopg.Error as exc:  # pragma: no cover - reported by the demo
                    self.errors.append(str(exc))
                time.sleep(self.pause)

    def _one(self, conn: psycopg.Connection, next_order: int) -> int:
        """One random transaction's statements; returns the next free order id."""
        kind = self.rng.random()
        if kind < 0.35:  # a new order with lines
            self._new_order(conn, next_order)
            return next_order + 1
        if kind < 0.60:  # status changes (non-key update)
            r = self.rng
            conn.execute(
                "UPDATE orders SET status = %s, note = %s WHERE id = %s",
                (r.choice(["paid", "shipped", "closed"]), r.choice([None, "rush", "gift"]), r.randint(1, next_order)),
            )
        elif kind < 0.75:  # customer moves; sometimes a new e-mail (unique key -> DELETE/INSERT)
            self._customer_change(conn)
        elif kind < 0.85:  # price change
            conn.execute(
                "UPDATE products SET price = price + 1, attrs = attrs || '{\"sale\": true}' "
                "WHERE sku = (SELECT sku FROM products ORDER BY random() LIMIT 1)"
            )
        elif kind < 0.90:  # renamed SKU: primary-key update that cascades to order lines
            conn.execute(
                "UPDATE products SET sku = sku || '-R' || %s "
                "WHERE sku = (SELECT sku FROM products ORDER BY random() LIMIT 1)",
                (self.rng.randint(1, 10**6),),
            )
        else:  # cancelled order: delete cascades to its lines
            conn.execute("DELETE FROM orders WHERE id = %s", (self.rng.randint(1, next_order),))
        return next_order

    def _new_order(self, conn: psycopg.Connection, order_id: int) -> None:
        r = self.rng
        (cust,) = raw_sql.one_row(conn.execute("SELECT id FROM customers ORDER BY random() LIMIT 1"))
        conn.execute(
            "INSERT INTO orders (id, customer_id, status, ordered_at, total) VALUES (%s, %s, 'new', now(), 0)",
            (order_id, cust),
        )
        for line in range(1, r.randint(1, 4) + 1):
            conn.execute(
                "INSERT INTO order_lines (order_id, line_no, sku, qty, price) "
                "SELECT %s, %s, sku, %s, price FROM products ORDER BY random() LIMIT 1",
                (order_id, line, r.randint(1, 9)),
            )
        conn.execute(
            "UPDATE orders SET total = (SELECT sum(qty * price) FROM order_lines WHERE order_id = %s) WHERE id = %s",
            (order_id, order_id),
        )

    def _customer_change(self, conn: psycopg.Connection) -> None:
        r = self.rng
        cid = r.randint(1, 20000)
        if r.random() < 0.5:
            conn.execute(
                "UPDATE customers SET city = %s WHERE id = %s",
                (r.choice(["Lisbon", "Porto", "Dallas", "New York", "Oslo"]), cid),
            )
        else:
            conn.execute(
                "UPDATE customers SET email = %s WHERE id = %s", (f"c{cid}.{r.randint(1, 10**9)}@example.com", cid)
            )
