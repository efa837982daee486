-- Helpers for the regression tests that follow (run first, same database).

-- err(q): run q; show its SQLSTATE, message and detail instead of failing.
CREATE FUNCTION public.err(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    detail text;
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
    RETURN SQLSTATE || ': ' || SQLERRM
        || CASE WHEN detail <> '' THEN E'\nDETAIL: ' || detail ELSE '' END;
END $$;
