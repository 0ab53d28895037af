-- Identities: a Telegram chat or a WhatsApp number -> the person it belongs to.
--
-- linked_at tells a linked identity (its person is a web account: links.sql) from one that
-- IDENTITY_POLICY=auto made for an unknown sender (its person exists only through it).
--
-- opted_out_at: when the chat or number asked its platform for no more messages (an SMS number's
-- STOP, which Twilio answers and keeps itself, refusing every later send with its error 21610),
-- learned from that message or from such a refusal; null while it takes messages. Nothing is sent
-- to it meanwhile, and nothing asked of the model for it (owed_replies.sql, follow_ups.sql; a message
-- it writes is stored, unanswered: turn.sql's begin_turn), until its opt-in word (START) clears it
-- (record_opt_out), which lets go the follow-ups held for it. It goes with the identity (unlinked,
-- erased).

create table public.identities (
    surface public.chat_surface not null,
    external_id text not null,
    user_id uuid not null,
    created_at timestamptz not null default clock_timestamp(),
    linked_at timestamptz,
    opted_out_at timestamptz,
    primary key (surface, external_id)
);
alter table public.identities enable row level security;  -- who reads what: access.sql
create index identities_by_user on public.identities (user_id);


-- The identity of a sender's other id (p_sender_alias: a WhatsApp number beside its BSUID) as the
-- same sender's: null when there is none, when it is the sender id itself, or when its person
-- writes with another BSUID (the number has passed to someone else, who starts anew). Held `for
-- key share`, as turn_person (turn.sql) holds the sender's. What a turn joins a new sender id to,
-- and what `forget` from that id forgets (forgetting.sql).
create function crossmem_private.alias_identity(p_surface text, p_sender_id text, p_sender_alias text)
    returns public.identities language plpgsql set search_path = '' as $$
declare
    v_alias public.identities;
begin
    if p_sender_alias is null or p_sender_alias = p_sender_id then
        return null;
    end if;
    select i.* into v_alias
      from public.identities i
     where i.surface = p_surface and i.external_id = p_sender_alias
       for key share;
    if exists (select from public.identities j
                where j.surface = p_surface and j.user_id = v_alias.user_id
                  and j.external_id <> p_sender_alias and j.external_id ~ '^[A-Z]{2}(\.ENT)?\.') then
        return null;  -- the number's person has a BSUID of their own: not this sender
    end if;
    return v_alias;
end;
$$;

-- A person's Telegram chats and WhatsApp numbers, oldest link first.
create or replace function public.list_identities(p_user_id uuid)
    returns jsonb language sql stable set search_path = '' as $$
    select coalesce(jsonb_agg(jsonb_build_object('surface', i.surface, 'external_id', i.external_id,
                                                 'linked_at', coalesce(i.linked_at, i.created_at))
                              order by coalesce(i.linked_at, i.created_at), i.surface, i.external_id),
                    '[]'::jsonb)
      from public.identities i
     where i.user_id = p_user_id;
$$;

-- A person's language as remembered (person_languages, follow_ups.sql), for a fixed answer given
-- without a turn (a command's, a notice's: docs/decisions.md, "The person's language"): p_user_id's
-- (the owner policy's person), else the person of the identity (surface, external id); null for
-- a sender never seen. A merge moves the identity and the language together (links.sql).
create or replace function public.person_language(p_user_id uuid, p_surface text, p_external_id text)
    returns text language plpgsql stable set search_path = '' as $$
begin
    return (select l.language
              from public.person_languages l
             where l.user_id = coalesce(p_user_id, (select i.user_id from public.identities i
                                                     where i.surface = p_surface and i.external_id = p_external_id)));
end;
$$;

-- A chat or number opted out (p_opted_out) or in again, as its platform told us: its message (an
-- SMS's STOP, START) or a send it refused as opted out. Its identity's: p_user_id's, the owner
-- policy's person for a number the operator lists, whose identity is made when an opt-out has none
-- (that policy keeps none otherwise), linked as link_identity makes one (the owner is a web account:
-- under `auto` later, the number is theirs, not a person of its own whom a link would merge
-- away with the owner's history); else whoever's the identity is. An identity never seen
-- records nothing: nothing is ever sent to it. The first opt-out's time is kept. In again (from an
-- opt-out: an opt-in word of a number that never opted out lets go nothing), the
-- person's follow-ups held on p_surface for it are let go (follow_ups.sql's
-- let_go_after_opt_in): pending, for the job's next run, while their hold lasts at p_now (the
-- job's clock: each one's `held_until`), else given up. {"recorded": whether an identity took it,
-- "released", "given_up": how many held follow-ups went either way}.
create or replace function public.record_opt_out(
    p_surface text, p_external_id text, p_user_id uuid, p_opted_out boolean, p_now timestamptz
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_user uuid;
    v_released integer := 0;
    v_given_up integer := 0;
    v_was_out boolean := false;
begin
    if p_user_id is not null and p_opted_out then
        insert into public.identities (surface, external_id, user_id, linked_at, opted_out_at)
             values (p_surface, p_external_id, p_user_id, clock_timestamp(), clock_timestamp())
        on conflict (surface, external_id) do update
            set opted_out_at = coalesce(identities.opted_out_at, excluded.opted_out_at)
          where identities.user_id = excluded.user_id
        returning user_id into v_user;
    else
        -- whether this number was out: an opt-in word from one that never opted out (YES, an answer
        -- to the advisor) lets go nothing held for another of the person's numbers
        select i.opted_out_at is not null into v_was_out
          from public.identities i
         where i.surface = p_surface and i.external_id = p_external_id
           and (p_user_id is null or i.user_id = p_user_id)
           for update;
        update public.identities i
           set opted_out_at = case when p_opted_out then coalesce(i.opted_out_at, clock_timestamp()) end
         where i.surface = p_surface and i.external_id = p_external_id
           and (p_user_id is null or i.user_id = p_user_id)
        returning i.user_id into v_user;
    end if;
    if v_user is not null and not p_opted_out and v_was_out then
        select l.released, l.given_up into v_released, v_given_up
          from crossmem_private.let_go_after_opt_in(v_user, p_surface, p_now) l;
    end if;
    return jsonb_build_object('recorded', v_user is not null, 'released', v_released, 'given_up', v_given_up);
end;
$$;

-- A person's chats or numbers on p_surface that opted out (a JSON array of their ids): what the
-- scheduled job sends nothing to (owed_replies.sql, follow_ups.sql), and whether begin_turn answers
-- a message (turn.sql).
create function crossmem_private.opted_out_of(p_user_id uuid, p_surface text)
    returns jsonb language sql stable set search_path = '' as $$
    select coalesce(jsonb_agg(i.external_id order by i.external_id), '[]'::jsonb)
      from public.identities i
     where i.user_id = p_user_id and i.surface = p_surface and i.opted_out_at is not null;
$$;
