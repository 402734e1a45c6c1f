-- The deliveries notice (§5.10): a statement that inserts deliveries (the outbox
-- trigger, for any event written) tells every replica's deliverer on
-- `waitd_deliveries`, so that it claims at that commit rather than at its next
-- idle look. NOTIFY goes out with the commit, and not at all when the transaction
-- rolls back; notices alike within one transaction are one.
CREATE FUNCTION waitd_deliveries_notice() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM added) THEN
        PERFORM pg_notify('waitd_deliveries', 'queued');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER deliveries_notice AFTER INSERT ON deliveries
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION waitd_deliveries_notice();
