-- The version guard skips an UPDATE that does not make the version newer, but never a foreign
-- key's own action: ON UPDATE CASCADE, ON DELETE SET NULL and SET DEFAULT change the
-- referencing columns of a guarded table and leave its version as it is. Skipped, they would
-- leave rows pointing at keys that are gone, and no constraint would notice.
CREATE TABLE fk_parent (pid int PRIMARY KEY);
INSERT INTO fk_parent VALUES (10), (20), (30);
CREATE TABLE fk_child (
    id        int PRIMARY KEY,
    cascaded  int REFERENCES fk_parent ON UPDATE CASCADE,
    nulled    int REFERENCES fk_parent ON DELETE SET NULL,
    defaulted int DEFAULT 30 REFERENCES fk_parent ON DELETE SET DEFAULT,
    version   int
);
INSERT INTO fk_child VALUES (1, 10, 20, 20, 1);
SELECT idem_version_guard('fk_child') AS guarded;
UPDATE fk_parent SET pid = 11 WHERE pid = 10;
DELETE FROM fk_parent WHERE pid = 20;
SELECT id, cascaded, nulled, defaulted, version FROM fk_child;
SELECT count(*) AS dangling_references FROM fk_child AS c
WHERE NOT EXISTS (SELECT FROM fk_parent AS p WHERE p.pid = c.cascaded)
   OR (c.nulled IS NOT NULL AND NOT EXISTS (SELECT FROM fk_parent AS p WHERE p.pid = c.nulled))
   OR NOT EXISTS (SELECT FROM fk_parent AS p WHERE p.pid = c.defaulted);

-- Everything else is judged as before: an UPDATE that keeps the version, or lowers it, does
-- nothing; one that raises it lands.
UPDATE fk_child SET nulled = 30 WHERE id = 1;
UPDATE fk_child SET nulled = 30, version = 0 WHERE id = 1;
SELECT nulled, version FROM fk_child WHERE id = 1;
UPDATE fk_child SET nulled = 30, version = 2 WHERE id = 1;
SELECT nulled, version FROM fk_child WHERE id = 1;

-- The guard knows a foreign key's action by the security context PostgreSQL runs it in, which
-- an UPDATE made by a trigger during that action shares: such an UPDATE of another guarded
-- table is judged by its version, and passes only when it keeps the version, as the action's
-- own statement does.
CREATE TABLE fk_log (id int PRIMARY KEY, note text, version int);
INSERT INTO fk_log VALUES (1, 'at 5', 5), (2, 'at 5', 5);
SELECT idem_version_guard('fk_log') AS log_guarded;
CREATE FUNCTION fk_touch_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE fk_log SET note = 'lowered by the cascade', version = 4 WHERE id = 1;
  UPDATE fk_log SET note = 'kept by the cascade' WHERE id = 2;
  RETURN NEW;
END $$;
-- Named to fire before the guard, whose name it sorts ahead of.
CREATE TRIGGER a_touch_log BEFORE UPDATE ON fk_child FOR EACH ROW EXECUTE FUNCTION fk_touch_log();
UPDATE fk_parent SET pid = 12 WHERE pid = 11;
SELECT id, cascaded, version FROM fk_child;
SELECT id, note, version FROM fk_log ORDER BY id;
-- Outside a foreign key's action, the same UPDATEs are both skipped.
UPDATE fk_log SET note = 'kept by hand' WHERE id = 2;
UPDATE fk_log SET note = 'lowered by hand', version = 4 WHERE id = 1;
SELECT id, note, version FROM fk_log ORDER BY id;
DROP TABLE fk_child, fk_log, fk_parent;
DROP FUNCTION fk_touch_log();
