-- The surfaces, defined once: every table's surface column is a `public.surface`. A chat (every
-- surface but the web: one conversation a person, known by an identity, not by a web token) is a
-- `public.chat_surface`, the type of the columns only a chat can fill (identities, links, forget
-- requests); a chat's one conversation takes its title from conversation_title.
--
-- A new surface is an edit of this file alone, as SMS was: its name in `surface`'s list and its
-- title in conversation_title (tests/test_schema_definitions.py makes that edit for a fifth,
-- 'signal', and stores its turn, identity, link and forget request). A name listed without a title fails loudly: its first
-- conversation's insert meets the title's `not null`. On a deployed database the migration is
-- `alter domain public.surface drop constraint surface_known`, then `add constraint` with the new
-- list, and `create or replace function public.conversation_title`. (`add constraint` checks
-- every stored surface, holding off writes to those tables meanwhile; on a large messages table
-- add it `not valid`, as the old surfaces are all in the new list, and say so here too, or the
-- catalog test sees the two differ.)
--
-- Why domains, and not a table of surfaces that every surface column references: a foreign key
-- checks every message stored against one shared row and locks it (`for key share`), so every
-- person's turns would write to one page (under Citus, a reference table on every node); neither
-- a domain's check nor conversations' unique partial index may read another table; and the rule
-- that every foreign key is indexed would add an index to messages. Why the list is a literal,
-- not `conversation_title(value) is not null` (one line to edit instead of two): a check calling
-- a PL/pgSQL function costs about 5 µs a row stored (two messages a turn), and a SQL function the
-- planner inlines into a domain's check stays inlined in every open session, which goes on
-- refusing a surface added after it connected; an `alter domain` reaches every session at once,
-- and a literal costs what the tables' own checks cost.

create domain public.surface as text
    constraint surface_known check (value in ('web', 'telegram', 'whatsapp', 'sms'));

create domain public.chat_surface as public.surface
    constraint chat_surface_not_web check (value <> 'web');

-- The title of a chat's one conversation; null for the web, whose conversations are titled by
-- their first message (turn.sql's turn_conversation) or by the person (create_conversation).
create function public.conversation_title(p_surface text) returns text
    language sql immutable parallel safe set search_path = '' as $$
    select case p_surface
               when 'telegram' then '[Telegram]'
               when 'whatsapp' then '[WhatsApp]'
               when 'sms' then '[SMS]'
           end;
$$;

-- Whether a follow-up due on p_surface is said only within a window after the person's last
-- message there (WhatsApp's 24 hours, without an approved template: its adapter's `said_within`,
-- core/surfaces/whatsapp.py): past it, it is held and said first with the answer to their next
-- message there (follow_ups.sql's turn_follow_ups), and the follow-up job reads when that window
-- opened (`window_opened_at`). The one place the SQL names such a surface. A SQL-standard body,
-- bound when it is created, which the planner inlines where it is asked (with `set search_path`
-- it would be a call planned again at each turn: turn.sql's quoting says the same).
create function public.surface_has_window(p_surface text) returns boolean
    language sql immutable parallel safe
    return p_surface = 'whatsapp';
