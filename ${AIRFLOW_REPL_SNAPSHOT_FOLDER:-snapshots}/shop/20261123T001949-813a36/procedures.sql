CREATE OR REPLACE PROCEDURE "public"."sp_MSins_publiccustomers"("c1" bigint, "c2" text, "c3" text, "c4" text, "c5" timestamp with time zone)
LANGUAGE plpgsql AS $airflow_repl$
-- CALL syntax: c1, c2, c3, c4, c5
BEGIN
    INSERT INTO "public"."customers" ("id", "name", "email", "city", "created_at") VALUES ($1, $2, $3, $4, $5);
END;
$airflow_repl$;

CREATE OR REPLACE PROCEDURE "public"."sp_MSupd_publiccustomers"("c1" bigint, "c2" text, "c3" text, "c4" text, "c5" timestamp with time zone, "pkc1" bigint, "bitmap" bytea)
LANGUAGE plpgsql AS $airflow_repl$
-- SCALL syntax: c1, c2, c3, c4, c5, pkc1, bitmap
BEGIN
    UPDATE "public"."customers" SET "id" = CASE WHEN get_byte($7, 0) & 1 <> 0 THEN $1 ELSE "id" END, "name" = CASE WHEN get_byte($7, 0) & 2 <> 0 THEN $2 ELSE "name" END, "email" = CASE WHEN get_byte($7, 0) & 4 <> 0 THEN $3 ELSE "email" END, "city" = CASE WHEN get_byte($7, 0) & 8 <> 0 THEN $4 ELSE "city" END, "created_at" = CASE WHEN get_byte($7, 0) & 16 <> 0 THEN $5 ELSE "created_at" END WHERE "id" = $6;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'RP598',
            MESSAGE = format('row not found at the subscriber: update of %s with key (%s)=(%s) matched no row [20598]', 'public.customers', 'id', concat_ws(', ', $6::text));
    END IF;
END;
$airflow_repl$;

CREATE OR REPLACE PROCEDURE "public"."sp_MSdel_publiccustomers"("pkc1" bigint)
LANGUAGE plpgsql AS $airflow_repl$
-- CALL syntax: pkc1
BEGIN
    DELETE FROM "public"."customers" WHERE "id" = $1;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'RP598',
            MESSAGE = format('row not found at the subscriber: delete of %s with key (%s)=(%s) matched no row [20598]', 'public.customers', 'id', concat_ws(', ', $1::text));
    END IF;
END;
$airflow_repl$;

CREATE OR REPLACE PROCEDURE "public"."sp_MSins_publicproducts"("c1" text, "c2" text, "c3" numeric(10,2), "c4" text[], "c5" jsonb)
LANGUAGE plpgsql AS $airflow_repl$
-- CALL syntax: c1, c2, c3, c4, c5
BEGIN
    INSERT INTO "public"."products" ("sku", "name", "price", "tags", "attrs") VALUES ($1, $2, $3, $4, $5);
END;
$airflow_repl$;

CREATE OR REPLACE PROCEDURE "public"."sp_MSupd_publicproducts"("c1" text, "c2" text, "c3" numeric(10,2), "c4" text[], "c5" jsonb, "pkc1" text, "bitmap" bytea)
LANGUAGE plpgsql AS $airflow_repl$
-- SCALL syntax: c1, c2, c3, c4, c5, pkc1, bitmap
BEGIN
    UPDATE "public"."products" SET "sku" = CASE WHEN get_byte($7, 0) & 1 <> 0 THEN $1 ELSE "sku" END, "name" = CASE WHEN get_byte($7, 0) & 2 <> 0 THEN $2 ELSE "name" END, "price" = CASE WHEN get_byte($7, 0) & 4 <> 0 THEN $3 ELSE "price" END, "tags" = CASE WHEN get_byte($7, 0) & 8 <> 0 THEN $4 ELSE "tags" END, "attrs" = CASE WHEN get_byte($7, 0) & 16 <> 0 THEN $5 ELSE "attrs" END WHERE "sku" = $6;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'RP598',
            MESSAGE = format('row not found at the subscriber: update of %s with key (%s)=(%s) matched no row [20598]', 'public.products', 'sku', concat_ws(', ', $6::text));
    END IF;
END;
$airflow_repl$;

CREATE OR REPLACE PROCEDURE "public"."sp_MSdel_publicproducts"("pkc1" text)
LANGUAGE plpgsql AS $airflow_repl$
-- CALL syntax: pkc1
BEGIN
    DELETE FROM "public"."products" WHERE "sku" = $1;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'RP598',
            MESSAGE = format('row not found at the subscriber: delete of %s with key (%s)=(%s) matched no row [20598]', 'public.products', 'sku', concat_ws(', ', $1::text));
    END IF;
END;
$airflow_repl$;

CREATE OR REPLACE PROCEDURE "public"."sp_MSins_publicorders"("c1" bigint, "c2" bigint, "c3" text, "c4" timestamp with time zone, "c5" numeric(12,2), "c6" text)
LANGUAGE plpgsql AS $airflow_repl$
-- CALL syntax: c1, c2, c3, c4, c5, c6
BEGIN
    INSERT INTO "public"."orders" ("id", "customer_id", "status", "ordered_at", "total", "note") VALUES ($1, $2, $3, $4, $5, $6);
END;
$airflow_repl$;

CREATE OR REPLACE PROCEDURE "public"."sp_MSupd_publicorders"("c1" bigint, "c2" bigint, "c3" text, "c4" timestamp with time zone, "c5" numeric(12,2), "c6" text, "pkc1" bigint, "bitmap" bytea)
LANGUAGE plpgsql AS $airflow_repl$
-- SCALL syntax: c1, c2, c3, c4, c5, c6, pkc1, bitmap
BEGIN
    UPDATE "public"."orders" SET "id" = CASE WHEN get_byte($8, 0) & 1 <> 0 THEN $1 ELSE "id" END, "customer_id" = CASE WHEN get_byte($8, 0) & 2 <> 0 THEN $2 ELSE "customer_id" END, "status" = CASE WHEN get_byte($8, 0) & 4 <> 0 THEN $3 ELSE "status" END, "ordered_at" = CASE WHEN get_byte($8, 0) & 8 <> 0 THEN $4 ELSE "ordered_at" END, "total" = CASE WHEN get_byte($8, 0) & 16 <> 0 THEN $5 ELSE "total" END, "note" = CASE WHEN get_byte($8, 0) & 32 <> 0 THEN $6 ELSE "note" END WHERE "id" = $7;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'RP598',
            MESSAGE = format('row not found at the subscriber: update of %s with key (%s)=(%s) matched no row [20598]', 'public.orders', 'id', concat_ws(', ', $7::text));
    END IF;
END;
$airflow_repl$;

CREATE OR REPLACE PROCEDURE "public"."sp_MSdel_publicorders"("pkc1" bigint)
LANGUAGE plpgsql AS $airflow_repl$
-- CALL syntax: pkc1
BEGIN
    DELETE FROM "public"."orders" WHERE "id" = $1;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'RP598',
            MESSAGE = format('row not found at the subscriber: delete of %s with key (%s)=(%s) matched no row [20598]', 'public.orders', 'id', concat_ws(', ', $1::text));
    END IF;
END;
$airflow_repl$;

CREATE OR REPLACE PROCEDURE "public"."sp_MSins_publicorder_lines"("c1" bigint, "c2" integer, "c3" text, "c4" integer, "c5" numeric(10,2))
LANGUAGE plpgsql AS $airflow_repl$
-- CALL syntax: c1, c2, c3, c4, c5
BEGIN
    INSERT INTO "public"."order_lines" ("order_id", "line_no", "sku", "qty", "price") VALUES ($1, $2, $3, $4, $5);
END;
$airflow_repl$;

CREATE OR REPLACE PROCEDURE "public"."sp_MSupd_publicorder_lines"("c1" bigint, "c2" integer, "c3" text, "c4" integer, "c5" numeric(10,2), "pkc1" bigint, "pkc2" integer, "bitmap" bytea)
LANGUAGE plpgsql AS $airflow_repl$
-- SCALL syntax: c1, c2, c3, c4, c5, pkc1, pkc2, bitmap
BEGIN
    UPDATE "public"."order_lines" SET "order_id" = CASE WHEN get_byte($8, 0) & 1 <> 0 THEN $1 ELSE "order_id" END, "line_no" = CASE WHEN get_byte($8, 0) & 2 <> 0 THEN $2 ELSE "line_no" END, "sku" = CASE WHEN get_byte($8, 0) & 4 <> 0 THEN $3 ELSE "sku" END, "qty" = CASE WHEN get_byte($8, 0) & 8 <> 0 THEN $4 ELSE "qty" END, "price" = CASE WHEN get_byte($8, 0) & 16 <> 0 THEN $5 ELSE "price" END WHERE "order_id" = $6 AND "line_no" = $7;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'RP598',
            MESSAGE = format('row not found at the subscriber: update of %s with key (%s)=(%s) matched no row [20598]', 'public.order_lines', 'order_id, line_no', concat_ws(', ', $6::text, $7::text));
    END IF;
END;
$airflow_repl$;

CREATE OR REPLACE PROCEDURE "public"."sp_MSdel_publicorder_lines"("pkc1" bigint, "pkc2" integer)
LANGUAGE plpgsql AS $airflow_repl$
-- CALL syntax: pkc1, pkc2
BEGIN
    DELETE FROM "public"."order_lines" WHERE "order_id" = $1 AND "line_no" = $2;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'RP598',
            MESSAGE = format('row not found at the subscriber: delete of %s with key (%s)=(%s) matched no row [20598]', 'public.order_lines', 'order_id, line_no', concat_ws(', ', $1::text, $2::text));
    END IF;
END;
$airflow_repl$;
