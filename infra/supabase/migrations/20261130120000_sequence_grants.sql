-- Sequences: Supabase's default privileges grant every new sequence in `public` to anon
-- and authenticated, and the memory core revoked them on its tables and functions but not
-- on `messages_id_seq`. With them, `authenticated` could call setval() on it and make
-- every later insert fail on the primary key. Nobody but the owner needs a sequence
-- here: identity columns draw their values without a grant on it.

revoke all on all sequences in schema public from public, anon, authenticated;
