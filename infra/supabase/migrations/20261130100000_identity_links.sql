-- Identity linking: one person on every app.
--
-- A signed-in web person asks for a link code; a Telegram chat or a WhatsApp number that
-- sends it becomes theirs. When that identity already had a person of its own (made by
-- IDENTITY_POLICY=auto for an unknown sender), that person's history moves to the web
-- person in the same transaction, so nothing said before the link is lost.
--
-- Tables: link_codes (only a hash of each code), link_attempts (wrong codes, per identity,
-- for the hourly limit). identities.linked_at tells a linked identity (its person is a
-- web account) from one `auto` made (its person exists only through it).
-- Every function is executable by service_role only and scoped by person or identity.

alter table public.identities add column linked_at timestamptz;

create table public.link_codes (
    -- sha256 of the code as typed, upper-cased, without spaces or dashes; never the code.
    code_hash text primary key check (code_hash ~ '^[0-9a-f]{64}$'),
    user_id uuid not null,
    created_at timestamptz not null default clock_timestamp(),
    expires_at timestamptz not null,
    used_at timestamptz,
    used_by_surface text check (used_by_surface in ('telegram', 'whatsapp')),
    used_by_external_id text
);
create index link_codes_by_user on public.link_codes (user_id);

create table public.link_attempts (
    surface text not null check (surface in ('telegram', 'whatsapp')),
    external_id text not null,
    attempted_at timestamptz not null default clock_timestamp()
);
create index link_attempts_by_identity on public.link_attempts (surface, external_id, attempted_at desc);

alter table public.link_codes enable row level security;
alter table public.link_attempts enable row level security;

revoke all on table public.link_codes, public.link_attempts from anon, authenticated;
grant select on table public.link_codes to authenticated;
grant select, insert, update, delete on table public.link_codes, public.link_attempts to service_role;

create policy link_codes_owner_reads on public.link_codes
    for select to authenticated using (user_id = (select auth.uid()));
-- link_attempts has no person (a wrong code belongs to nobody yet): no policy, so
-- `authenticated` reads none of it.


-- A new code for a person; their earlier unused codes stop working (the newest one is the
-- one on their screen).
create function public.create_link_code(p_user_id uuid, p_code_hash text, p_ttl_minutes integer)
returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_expires timestamptz := clock_timestamp() + make_interval(mins => greatest(p_ttl_minutes, 1));
begin
    delete from public.link_codes c
     where c.user_id = p_user_id and (c.used_at is null or c.expires_at < clock_timestamp() - interval '1 day');
    insert into public.link_codes (code_hash, user_id, expires_at) values (p_code_hash, p_user_id, v_expires);
    return jsonb_build_object('expires_at', v_expires);
end;
$$;


-- Join an identity to a person (the code's, or an operator's choice).
--   not known yet        -> a new identity of the person
--   already the person's -> nothing to do
--   made by `auto`       -> the identity and all of its person's history move to the person;
--                           a Telegram or WhatsApp conversation the person already has takes
--                           the other's messages (their created_at keeps the order), so one
--                           conversation per surface still holds
--   linked to another    -> the identity moves; the other account keeps what was said (theirs)
-- Returns {"status": "linked"|"already_linked", "user_id", "moved_messages"}.
create function public.link_identity(p_user_id uuid, p_surface text, p_external_id text)
returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_previous uuid;
    v_linked_at timestamptz;
    v_from record;
    v_into uuid;
    v_moved integer := 0;
    v_count integer;
begin
    if p_surface not in ('telegram', 'whatsapp') then
        raise exception 'only telegram and whatsapp identities are linked' using errcode = '22023';
    end if;
    select i.user_id, i.linked_at into v_previous, v_linked_at
      from public.identities i
     where i.surface = p_surface and i.external_id = p_external_id
       for update;

    if not found then
        insert into public.identities (surface, external_id, user_id, linked_at)
             values (p_surface, p_external_id, p_user_id, clock_timestamp());
        return jsonb_build_object('status', 'linked', 'user_id', p_user_id, 'moved_messages', 0);
    end if;
    if v_previous = p_user_id then
        update public.identities i set linked_at = coalesce(i.linked_at, clock_timestamp())
         where i.surface = p_surface and i.external_id = p_external_id;
        return jsonb_build_object('status', 'already_linked', 'user_id', p_user_id, 'moved_messages', 0);
    end if;

    update public.identities i set user_id = p_user_id, linked_at = clock_timestamp()
     where i.surface = p_surface and i.external_id = p_external_id;

    if v_linked_at is null then
        -- The previous person was this identity alone: their whole history is the person's now.
        for v_from in
            select c.id, c.surface from public.conversations c where c.user_id = v_previous for update
        loop
            v_into := null;
            if v_from.surface <> 'web' then
                select c.id into v_into
                  from public.conversations c
                 where c.user_id = p_user_id and c.surface = v_from.surface
                   for update;
            end if;
            if v_into is null then
                update public.conversations c set user_id = p_user_id where c.id = v_from.id;
                update public.messages m set user_id = p_user_id where m.conversation_id = v_from.id;
                get diagnostics v_count = row_count;
            else
                -- A delivery both conversations hold (it cannot happen with Telegram's and
                -- Twilio's ids, but a constraint is a constraint) is kept once: the person's.
                delete from public.messages m
                 where m.conversation_id = v_from.id
                   and m.external_id is not null
                   and exists (select from public.messages x
                                where x.conversation_id = v_into
                                  and x.surface = m.surface and x.external_id = m.external_id);
                update public.messages m set conversation_id = v_into, user_id = p_user_id
                 where m.conversation_id = v_from.id;
                get diagnostics v_count = row_count;
                update public.conversations c
                   set updated_at = greatest(c.updated_at, (select f.updated_at from public.conversations f
                                                             where f.id = v_from.id))
                 where c.id = v_into;
                delete from public.conversations c where c.id = v_from.id;
            end if;
            v_moved := v_moved + v_count;
        end loop;
        update public.identities i set user_id = p_user_id, linked_at = clock_timestamp()
         where i.user_id = v_previous;
    end if;
    return jsonb_build_object('status', 'linked', 'user_id', p_user_id, 'moved_messages', v_moved);
end;
$$;


-- Redeem a code sent from an identity. One call: the hourly limit, the code (single-use:
-- of two identities racing for it, exactly one wins), the link and the merge.
-- Returns {"status": "linked"|"already_linked"|"invalid"|"expired"|"used"|"too_many_attempts", ...}.
create function public.redeem_link_code(
    p_surface text,
    p_external_id text,
    p_code_hash text,
    p_max_attempts integer default 5
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_since timestamptz := clock_timestamp() - interval '1 hour';
    v_failures integer;
    v_first_failure timestamptz;
    v_user uuid;
    v_code record;
    v_status text;
begin
    -- One identity's attempts are counted one at a time, so two at once cannot both pass.
    perform pg_advisory_xact_lock(hashtextextended('link:' || p_surface || ':' || p_external_id, 0));
    select count(*), min(a.attempted_at) into v_failures, v_first_failure
      from public.link_attempts a
     where a.surface = p_surface and a.external_id = p_external_id and a.attempted_at > v_since;
    if p_max_attempts > 0 and v_failures >= p_max_attempts then
        return jsonb_build_object('status', 'too_many_attempts',
                                  'retry_at', v_first_failure + interval '1 hour');
    end if;

    update public.link_codes c
       set used_at = clock_timestamp(), used_by_surface = p_surface, used_by_external_id = p_external_id
     where c.code_hash = p_code_hash and c.used_at is null and c.expires_at > clock_timestamp()
    returning c.user_id into v_user;

    if v_user is null then
        select c.user_id, c.used_at, c.used_by_surface, c.used_by_external_id, c.expires_at into v_code
          from public.link_codes c where c.code_hash = p_code_hash;
        if v_code.user_id is not null and v_code.used_by_surface = p_surface
           and v_code.used_by_external_id = p_external_id then
            -- The same identity again (a redelivered /start): it is linked, say so again.
            return jsonb_build_object('status', 'already_linked', 'user_id', v_code.user_id, 'moved_messages', 0);
        end if;
        v_status := case when v_code.user_id is null then 'invalid'
                         when v_code.used_at is not null then 'used'
                         else 'expired' end;
        insert into public.link_attempts (surface, external_id) values (p_surface, p_external_id);
        delete from public.link_attempts a where a.attempted_at < clock_timestamp() - interval '1 day';
        return jsonb_build_object('status', v_status);
    end if;
    return public.link_identity(v_user, p_surface, p_external_id);
end;
$$;


-- A person's Telegram chats and WhatsApp numbers, oldest link first.
create function public.list_identities(p_user_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
    select coalesce(jsonb_agg(jsonb_build_object('surface', i.surface, 'external_id', i.external_id,
                                                 'linked_at', coalesce(i.linked_at, i.created_at))
                              order by coalesce(i.linked_at, i.created_at), i.surface, i.external_id),
                    '[]'::jsonb)
      from public.identities i
     where i.user_id = p_user_id;
$$;


-- Unlink: the person's identities on a surface (the web's DELETE /links/<surface>), or one
-- identity (/unlink on Telegram, `unlink` on WhatsApp, the operator's command). Only linked
-- identities: one made by `auto` is its person's only way in. The person keeps every
-- message; the identity's next message starts a new person.
create function public.unlink_identities(
    p_surface text,
    p_user_id uuid default null,
    p_external_id text default null
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_count integer;
begin
    if p_user_id is null and p_external_id is null then
        raise exception 'unlink_identities needs a person or an identity' using errcode = '22023';
    end if;
    delete from public.identities i
     where i.surface = p_surface
       and i.linked_at is not null
       and (p_user_id is null or i.user_id = p_user_id)
       and (p_external_id is null or i.external_id = p_external_id);
    get diagnostics v_count = row_count;
    return jsonb_build_object('unlinked', v_count);
end;
$$;


revoke all on function
    public.create_link_code(uuid, text, integer),
    public.link_identity(uuid, text, text),
    public.redeem_link_code(text, text, text, integer),
    public.list_identities(uuid),
    public.unlink_identities(text, uuid, text)
from public, anon, authenticated;

grant execute on function
    public.create_link_code(uuid, text, integer),
    public.link_identity(uuid, text, text),
    public.redeem_link_code(text, text, text, integer),
    public.list_identities(uuid),
    public.unlink_identities(text, uuid, text)
to service_role;
