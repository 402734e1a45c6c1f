-- A replica of the version before 0007 inserts waits without `claim_at`. During a
-- rolling upgrade such a wait would be claimed only while an old replica still ran
-- (its claim orders by next_poll_at); once none is left it would never be claimed.
-- A row inserted without a claim order takes its next poll as one. The check costs
-- a few microseconds an insert; a current replica always sets the column itself.
CREATE FUNCTION waitd_claim_at_default() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.claim_at IS NULL THEN
        NEW.claim_at := NEW.next_poll_at;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER waits_claim_at_default BEFORE INSERT ON waits
    FOR EACH ROW WHEN (NEW.claim_at IS NULL) EXECUTE FUNCTION waitd_claim_at_default();

-- Those inserted by an old replica since 0007 ran.
UPDATE waits SET claim_at = next_poll_at WHERE status = 'running' AND claim_at IS NULL;
