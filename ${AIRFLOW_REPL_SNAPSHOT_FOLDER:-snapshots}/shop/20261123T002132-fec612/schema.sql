CREATE SCHEMA IF NOT EXISTS "public";
DROP TABLE IF EXISTS "public"."customers" CASCADE;
CREATE TABLE "public"."customers" (
    "id" bigint NOT NULL,
    "name" text NOT NULL,
    "email" text,
    "city" text,
    "created_at" timestamp with time zone NOT NULL,
    PRIMARY KEY ("id"),
    UNIQUE ("email")
);

CREATE SCHEMA IF NOT EXISTS "public";
DROP TABLE IF EXISTS "public"."products" CASCADE;
CREATE TABLE "public"."products" (
    "sku" text NOT NULL,
    "name" text NOT NULL,
    "price" numeric(10,2) NOT NULL,
    "tags" text[],
    "attrs" jsonb,
    PRIMARY KEY ("sku")
);

CREATE SCHEMA IF NOT EXISTS "public";
DROP TABLE IF EXISTS "public"."orders" CASCADE;
CREATE TABLE "public"."orders" (
    "id" bigint NOT NULL,
    "customer_id" bigint NOT NULL,
    "status" text NOT NULL,
    "ordered_at" timestamp with time zone NOT NULL,
    "total" numeric(12,2),
    "note" text,
    PRIMARY KEY ("id")
);

CREATE SCHEMA IF NOT EXISTS "public";
DROP TABLE IF EXISTS "public"."order_lines" CASCADE;
CREATE TABLE "public"."order_lines" (
    "order_id" bigint NOT NULL,
    "line_no" integer NOT NULL,
    "sku" text NOT NULL,
    "qty" integer NOT NULL,
    "price" numeric(10,2) NOT NULL,
    PRIMARY KEY ("order_id", "line_no")
);
