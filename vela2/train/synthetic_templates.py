"""The phrasings and slot values `vela2.train.synthetic` builds customer messages from, in families.

A family is a group of phrasings (or of slot values) of one style: "refund / money" holds the
sentences that ask for money back, "phone / paren" the (415) 555-0142 numbers. The families named in
`HELD_OUT` (and the held-out lists of names, companies, mail hosts, cities and products) are never in
a training row: rows of the "held_out" split are made of them alone, so that the demo's held-out scores
measure phrasings, names and formats it never saw, not new rows of the templates it learnt.
Placeholders: {person}, {company}, {email}, {phone} (labelled spans), {city}, {product} (unlabelled
names), {item}, {amount}, {when}, {time}, {days}, {ref}, {site} (plain text).
"""

from __future__ import annotations

# Held-out phrasings are new sentence frames and new sentences over the words the training families
# use: a model trained from scratch on these messages cannot know what a word it never saw means
# ("credit my account", "brilliant"), but it should read a request or a mood it knows in words it has seen
# put another way.


def _frames(frames: list[str], fills: list[str], slot: str) -> list[str]:
    """Every frame with `{slot}` filled by every fill."""
    return [f.replace("{" + slot + "}", k) for f in frames for k in fills]


WANT = {  # intent -> what the customer wants, as a verb phrase
    "refund": ["get a refund for {item}", "get my money back for {item}", "have {item} refunded",
               "get the payment for {item} back", "be reimbursed for {item}", "get a full refund"],
    "delivery": ["find out where my parcel is", "track {item}", "know when {item} will be delivered",
                 "get {item} delivered", "check the shipment of {item}", "know why the delivery is late"],
    "password": ["reset my password", "get back into my account", "log in again", "change my password",
                 "unlock my account", "fix my login"],
    "cancel": ["cancel my subscription", "close my account", "stop the plan", "end my membership",
               "cancel the contract", "stop the monthly renewal"],
}
WANT_MORE = {  # more of them, in training frames only (held-out frames take WANT's)
    "refund": ["return {item} for a refund", "get the money for {item} back on my card"],
    "delivery": ["find my package", "get a delivery date for {item}"],
    "password": ["sign in to my account", "get a new password"],
    "cancel": ["quit the plan", "cancel my membership today"],
}
WANT_FRAMES = ["I would like to {want}.", "Please help me {want}.", "I want to {want}.", "Can you help me {want}?",
               "How can I {want}?", "I need to {want} today.", "I'd like to {want}, please.",
               "Is it possible to {want}?", "I am writing to {want}.", "Could I {want} this week?",
               "I wish to {want}.", "Help me {want}, please.", "I hope you can help me {want}.",
               "I still need to {want}.", "Where can I {want}?", "Please let me {want}."]
WANT_FRAMES_NEW = ["Is there a way to {want}?", "I am trying to {want}.", "All I want is to {want}.",
                   "What do I do to {want}?"]

# intent -> family -> sentences
INTENTS: dict[str, dict[str, list[str]]] = {
    intent: {
        "frames": _frames(WANT_FRAMES, wants + WANT_MORE[intent], "want"),
        "frames-new": _frames(WANT_FRAMES_NEW, wants, "want"),
        **statements,
    }
    for intent, wants, statements in (
        ("refund", WANT["refund"], {
            "money": ["Please send my money back, {item} was broken.", "I expect the money for {item} back on my card.",
                      "Refund please.", "Money back, please.", "I sent {item} back, so please pay me back."],
            "refund": ["I would like a refund for {item}.", "Can I get a refund for {item}?", "Please refund {item}.",
                       "I need a refund.", "refund for {item} pls"],
            "returned": ["I returned {item} weeks ago and still have no refund.", "The refund for {item} never came.",
                         "You owe me a refund for {item}.", "Where is the refund for {item}?",
                         "I was charged for {item} and want the money back.", "I never got my money back.",
                         "I am still waiting for my refund."],
            "broken": ["{item} was broken, so I expect a full refund.", "Money back for {item}, it was damaged.",
                       "Please pay me back for {item}."]}),
        ("delivery", WANT["delivery"], {
            "where": ["Where is my package, it has not arrived yet.", "Where is {item}?", "My parcel has not arrived.",
                      "{item} still has not arrived."],
            "late": ["The delivery is late again, please check the shipment.", "The parcel is {days} days late.",
                     "The courier never came with {item}.", "The tracking page shows nothing for {item}."],
            "courier": ["The courier left {item} at the wrong door.", "Nobody delivered {item}.",
                        "The package is stuck somewhere on the way.", "Shipping takes far too long.",
                        "Still no parcel, and it was due {when}.", "When will {item} finally arrive?",
                        "I am still waiting for {item}."],
            "late-parcel": ["My parcel is late and the tracking shows nothing.",
                            "{item} has not arrived and the courier does not answer.",
                            "Where is {item}? The delivery is still not here."]}),
        ("password", WANT["password"], {
            "fails": ["My password does not work any more.", "The login fails with my password.",
                      "It says my password is wrong.", "I cannot log in, please reset my password."],
            "locked": ["I am locked out of my account.", "I forgot my password.", "Send me a password reset link.",
                       "I cannot access my account."],
            "access": ["The reset email never came.", "My login code does not work.", "I can't sign in any more.",
                       "The app keeps asking for my password.", "Someone changed my password.",
                       "My account is blocked after three tries."],
            "login": ["The login page says my password is wrong again.",
                      "I am locked out again and the reset link fails.", "My account will not let me log in."]}),
        ("cancel", WANT["cancel"], {
            "cancel": ["Please cancel my subscription from next month.", "Cancel the membership, I no longer need it.",
                       "Cancel my plan, please.", "I want to cancel my subscription."],
            "stop": ["Stop charging me every month.", "Close my account, please.", "Stop the renewal of my plan.",
                     "I do not need the plan any more, cancel it."],
            "quit": ["I want out of the contract.", "Please end my subscription now.", "Do not renew my plan.",
                     "Terminate my account, please.", "I am leaving, so cancel everything.",
                     "I will not pay for another month, cancel it.",
                     "I am done with this plan, cancel it."],
            "no-more": ["The membership is not for me, please stop it.",
                        "Please, no more renewals: end the plan today.", "Please close the subscription for good."]}),
    )
}

MOOD_NOUNS = ["support", "service", "team", "staff", "shop", "help"]
ADJECTIVES = {  # sentiment -> {adjective: the satisfaction score it says}
    "positive": {"great": "5", "excellent": "5", "fantastic": "5", "helpful": "4", "friendly": "4", "quick": "4",
                 "good": "4"},
    "negative": {"terrible": "1", "awful": "1", "horrible": "1", "slow": "2", "rude": "2", "bad": "2", "poor": "2"},
}
FEELINGS = {
    "positive": {"happy": "4", "very happy": "5", "satisfied": "4", "delighted": "5"},
    "negative": {"angry": "1", "furious": "1", "upset": "2", "disappointed": "2", "unhappy": "2"},
}
# words of mood only training rows use (held-out rows use the ones above, in new frames)
MORE_ADJECTIVES = {
    "positive": {"wonderful": "5", "amazing": "5", "nice": "4", "kind": "4", "fast": "4", "polite": "4"},
    "negative": {"lousy": "1", "useless": "1", "careless": "2", "unhelpful": "2", "sloppy": "2", "lazy": "2"},
}
MORE_FEELINGS = {
    "positive": {"pleased": "4", "glad": "4", "thrilled": "5", "really happy": "5"},
    "negative": {"annoyed": "2", "frustrated": "2", "fed up": "1", "so angry": "1", "sad": "2"},
}
ADJ_FRAMES = ["Your {noun} is {adj}.", "The {noun} was {adj}.", "What {adj} {noun} you have.",
              "I think your {noun} is {adj}.", "The {noun} is really {adj}.", "Your {noun} was so {adj} today.",
              "My experience with the {noun} was {adj}.", "Such {adj} {noun}.", "The {noun} here is always {adj}.",
              "Everyone says your {noun} is {adj}.", "I must say the {noun} was {adj}.", "Your {noun}: {adj}.",
              "It was a {adj} experience with your {noun}.", "The {noun} looked {adj} to me.",
              "We had {adj} {noun} from you.", "The {noun} you gave me was {adj}.", "Really {adj} {noun} this time.",
              "Once again the {noun} was {adj}.", "I call your {noun} {adj}.", "Your {noun} proved {adj}.",
              "Overall, the {noun} was {adj}.", "Lately your {noun} is {adj}.", "The {noun} turned out {adj}."]
ADJ_FRAMES_NEW = ["Honestly, the {noun} has been {adj}.", "I found your {noun} {adj}.",
                  "So far your {noun} seems {adj}."]
FEEL_FRAMES = ["I am {feel} with your {noun}.", "I am really {feel}.", "This makes me {feel}.",
               "We are {feel} with the {noun}.", "I was {feel} after talking to your {noun}.", "You made me {feel}.",
               "I'm so {feel} right now.", "My wife is {feel} with the {noun}.", "Still {feel} with your {noun}.",
               "The {noun} left me {feel}.", "My family is {feel}.", "I am more than {feel}.",
               "To be clear, I am {feel}.", "Your {noun} made my whole team {feel}.",
               "I got {feel} with your {noun}.", "We became {feel} about the {noun}.", "I remain {feel}.",
               "Now I am {feel} about the {noun}.", "Me? I am {feel}."]
FEEL_FRAMES_NEW = ["Frankly, I feel {feel} about the {noun}.", "All of us are {feel} now."]
# fixed sentences of mood: sentiment -> family -> {sentence: score}
MOOD_SENTENCES: dict[str, dict[str, dict[str, str]]] = {
    "positive": {
        "thanks": {"Thanks a lot, your team was great.": "4", "Thank you for the quick help.": "4",
                   "Many thanks, you were very helpful.": "4", "Thanks, the support was excellent.": "5"},
        "love": {"I really love the service, well done.": "5", "I love this shop.": "5",
                 "Your app is fantastic.": "5", "Great product, I am very happy.": "5"},
    },
    "negative": {
        "angry": {"This is terrible and I am very angry.": "1", "I am furious about this.": "1",
                  "This is unacceptable.": "1", "I am really upset.": "2"},
        "awful": {"Your support is awful and slow.": "2", "The service is bad.": "2",
                  "What a horrible experience.": "1", "Worst shop ever.": "1"},
    },
    "neutral": {
        "info": {"I am writing about this today.": "3", "Here are the details of the case.": "3",
                 "Let me know what you need from me.": "3", "Please see the details below.": "3"},
        "ask": {"I have a question.": "3", "Just checking in.": "3", "Please advise.": "3",
                "I look forward to your answer.": "3", "I'm writing about my order.": "3"},
        "plain": {"This is my second message about it.": "3", "Nothing else to add.": "3",
                  "I attached the receipt.": "3", "The order number is in the subject line.": "3"},
        "note": {"Here is the order number you asked for.": "3", "I called yesterday about the same thing.": "3",
                 "Please forward this to the right team.": "3", "My details are below.": "3",
                 "I am waiting for your answer.": "3", "Can you look into it?": "3"},
        "fyi": {"I will send more details tomorrow.": "3", "Just writing to check on the case.": "3",
                "Let me know if you need the receipt.": "3", "I have one more question about it.": "3"},
    },
}
# family -> (frames, words by sentiment, the frames' slot): sentences of mood made of a frame and a word
MOOD_FRAMES: dict[str, tuple[list[str], dict[str, dict[str, str]], str]] = {
    "adj": (ADJ_FRAMES, ADJECTIVES, "adj"),
    "feel": (FEEL_FRAMES, FEELINGS, "feel"),
    "adj-more": (ADJ_FRAMES, MORE_ADJECTIVES, "adj"),
    "feel-more": (FEEL_FRAMES, MORE_FEELINGS, "feel"),
    "adj-new": (ADJ_FRAMES_NEW, ADJECTIVES, "adj"),
    "feel-new": (FEEL_FRAMES_NEW, FEELINGS, "feel"),
}


def _mood(frames: list[str], words: dict[str, str], slot: str) -> dict[str, str]:
    """Every frame with every mood noun and every word of `words`: sentence -> the word's score."""
    by_noun = dict.fromkeys(f.replace("{noun}", n) for f in frames for n in MOOD_NOUNS)
    return {f.replace("{" + slot + "}", word): score for f in by_noun for word, score in words.items()}


# sentiment -> family -> {sentence: the satisfaction score (1-5) it expresses}: the frames' families, then
# the fixed sentences' (neutral messages have no words of mood to put in a frame)
SENTIMENTS: dict[str, dict[str, dict[str, str]]] = {
    sentiment: {
        **{family: _mood(frames, words[sentiment], slot) for family, (frames, words, slot) in MOOD_FRAMES.items()
           if sentiment in words},
        **MOOD_SENTENCES[sentiment],
    }
    for sentiment in ("positive", "negative", "neutral")
}

# topic -> family -> sentences
TOPICS: dict[str, dict[str, list[str]]] = {
    "finance": {
        "charge": ["My bank card was charged twice for the invoice.", "There is a double charge on my credit card.",
                   "I paid {amount} but the bill says more."],
        "invoice": ["The invoice shows the wrong amount.", "The bill for {when} is {amount} too high.",
                    "My bank statement lists a payment I never made."],
        "statement": ["The bank statement shows the same invoice twice.",
                      "My card payment went through but the bill is wrong."],
    },
    "technology": {
        "app": ["The app crashes on my laptop after the update.", "My phone app freezes on start.",
                "The software update broke the login screen."],
        "web": ["The website shows an error when I click pay.", "The checkout page stays blank.",
                "Your web shop logs me out every minute."],
        "update": ["The website shows an error after the update.", "The app on my laptop shows a blank page."],
    },
    "travel": {
        "flight": ["I booked a flight and a hotel for the trip.", "The flight was moved to another day.",
                   "My boarding pass for {when} has the wrong name."],
        "rail": ["My train ticket for {when} was wrong.", "The hotel room was not ready.",
                 "The bus to the airport never came.", "The booking for my trip is missing."],
        "booking": ["The hotel near the airport lost my booking.", "My flight ticket has the wrong date."],
    },
    "food": {
        "cold": ["The pizza and the salad arrived cold.", "The soup was cold and the bread was stale.",
                 "The noodles were cold when they came."],
        "missing": ["The restaurant forgot my dessert.", "The meal kit had missing ingredients.",
                    "Half of the sushi order was missing."],
        "meal": ["The restaurant sent a cold meal without dessert.", "The pizza was cold and the salad was missing."],
    },
}

TOXICITY: dict[str, dict[str, list[str]]] = {  # only in negative messages
    "insult": {
        "idiots": ["You are all useless idiots.", "What a bunch of clowns you are.",
                   "Your staff are complete morons."],
        "stupid": ["You are the dumbest company I know.", "Only a fool would work for you.", "Stupid, lazy people."],
        "insult-new": ["You are a bunch of stupid clowns.", "All of you are useless morons."],
    },
    "threat": {
        "hurt": ["Fix it or I will come to your office and hurt you.", "I know where you live, so watch out.",
                 "Do it today or something bad will happen to you."],
        "regret": ["You will regret this, I will make you pay.", "I will find you and make you suffer.",
                   "One more day and I will smash your shop."],
        "threat-new": ["You will be sorry, I will make you suffer.", "I will come to your shop and hurt you all."],
    },
}

# where the person (and company) of a message appear
INTROS: dict[str, list[str]] = {
    "this-is": ["Hello, this is {person} from {company}.", "Hi, this is {person} at {company}.",
                "Hello, this is {person}."],
    "name-is": ["Hi, my name is {person} ({company}).", "My name is {person} and I work for {company}.",
                "My name is {person}.", "My name is {person} ({email})."],
    "i-am": ["Dear team, I am {person} working for {company}.", "I am {person}, a client of {company}.",
             "Dear support, I'm {person}.", "I'm {person} ({email}) from {company}.", "Hello, I'm {person}."],
    "here": ["{person} here, from {company}.", "Hi, {person} at {company} here.", "{person} here."],
    "from": ["{person} writing from {company}.", "It's {person} here, from {company}.", "Greetings from {person}.",
             "From: {person} ({company})", "Sender: {person}", "Hi all, {person} of {company} speaking."],
    "intro-new": ["This is {person} writing for {company}.", "Hi, I'm {person} ({company}).",
                  "{person} from {company} again.", "Good morning, my name is {person}."],
}
SIGNOFFS: dict[str, list[str]] = {
    "best": ["Best, {person}", "Best wishes, {person}", "All the best, {person} ({company})"],
    "thanks": ["Thanks, {person}", "Thank you, {person}", "Many thanks, {person}"],
    "regards": ["Regards,\n{person}", "Regards, {person}, {company}", "-- {person}, {company}"],
    "cheers": ["Cheers, {person}", "Sincerely,\n{person}", "Yours truly, {person} ({company})", "Take care, {person}",
               "Warm wishes from {person}", "See you, {person}"],
    "signoff-new": ["Best regards, {person}", "Thanks again, {person} ({company})", "Regards and thanks,\n{person}",
                    "Many thanks and best wishes, {person}"],
}
GREETINGS = ["Hello,", "Hi team,", "Dear support,", "Hi there,", "Good day,"]

EMAIL_LEADS: dict[str, list[str]] = {
    "reach": ["You can reach me at {email}", "Reach me at {email}", "You can contact me at {email}"],
    "write": ["Write to {email}", "Reply to {email}", "Please answer to {email}"],
    "label": ["Contact: {email}", "Email: {email}", "E-mail: {email}", "My e-mail is {email}"],
    "mail-me": ["mail me at {email}", "email me at {email}", "Send the answer to {email}"],
    "inbox": ["my inbox is {email}", "I check {email} every day", "the best e-mail is {email}", "reply at {email}",
              "use {email}", "my work e-mail is {email}"],
    "answer-at": ["answer me at {email}", "forward it to {email}", "write me at {email}", "send a reply to {email}",
                  "get back to me at {email}", "any news to {email}"],
    "drop": ["drop me a line at {email}", "my address is {email}", "e-mail me on {email}", "send it to {email}"],
}
PHONE_LEADS: dict[str, list[str]] = {
    "call": ["call {phone}", "call me on {phone}", "or call {phone}", "ring {phone}", "or ring me on {phone}"],
    "phone": ["phone {phone}", "Phone: {phone}", "tel. {phone}", "Tel: {phone}"],
    "number": ["my number is {phone}", "mobile: {phone}", "my mobile is {phone}"],
    "dial": ["dial {phone}", "text me at {phone}", "my phone number is {phone}", "phone me at {phone}"],
}
CONTACT_JOINS = [" or ", ", ", " / ", ". Or ", "; "]  # between an e-mail lead and a phone lead
CONTACT_ENDS = [".", " today.", ", thanks.", "", "!"]

# sentences about the case that hold numbers, dates and addresses that are not PII (a phone label on
# every digit, an e-mail label on every dot, is what these teach away)
DETAILS: dict[str, list[str]] = {
    "order": ["My order number is {ref}.", "It is about order {ref}.", "The reference is {ref}."],
    "date": ["I ordered it on {when}.", "It happened on {when} at {time}.", "I wrote to you on {when}."],
    "money": ["I paid {amount} for it.", "The total was {amount}.", "It cost me {amount}."],
    "web": ["I used the form on www.{site}.com.", "Your page {site}.com/help did not help.",
            "I also wrote to your @{site} account."],
    "case": ["The case no. is {ref}.", "See ticket {ref} from {when}.", "Customer number {ref}."],
    "place": ["I ordered it from the {city} store.", "My flight to {city} was moved.",
              "I live in {city}, near your shop.", "The parcel went to {city} instead."],
    "product": ["I use the {product} app.", "The {product} model stopped working.", "It is about my {product} plan."],
}
# capitalized words that are no names (held-out rows have others): they are cut from the tokenizer's
# counts as names are, so that a capital and an unknown word do not make a name by themselves
CITIES = {"train": ("Berlin Madrid Lisbon Vienna Prague Dublin Oslo Warsaw Lyon Porto Seville Munich Leeds Turin "
                    "Krakow Gdansk Bergen Malmo Utrecht Ghent Geneva Bristol Toronto Denver Austin Boston").split(),
          "held_out": "Rotterdam Salzburg Tallinn Bordeaux Valencia Edinburgh Zagreb Helsinki".split()}
PRODUCTS = {"train": ("Zephyr Nova Orbit Pixel Falcon Atlas Vertex Comet Echo Quasar Lynx Titan Aurora "
                      "Summit Prism Kestrel").split(),
            "held_out": "Cascade Helix Meteor Solstice".split()}
DISCOURSE = ["Honestly,", "Frankly,", "Sadly,", "Also,", "Again,", "Anyway,", "Seriously,", "Luckily,", "Actually,",
             "Sorry,", "Well,", "Okay,", "So,", "Btw,", "PS:", "Update:", "Oh,", "Also:"]  # a sentence's opener

ITEMS = ["my last order", "the order", "my headphones", "the blue jacket", "the coffee machine", "my ticket",
         "the booking", "order {ref}", "the parcel", "my new phone case", "the gift card", "the shoes",
         "the laptop bag", "the subscription box", "the desk lamp", "my purchase"]
WHEN = ["yesterday", "last week", "Monday", "12/03/2025", "2025-03-12", "March 3", "3 May", "last Friday",
        "14.02.2024", "this morning"]

# names, companies and e-mail domains: training and held-out lists are disjoint
FIRST_NAMES = {
    "train": ("Alice Bob Carol David Emma Frank Grace Henry Irene Jack Karen Liam Maria Noah Olivia Paul Quinn "
              "Rosa Samuel Tara Victor Wendy Yusuf Zoe Amir Bianca Chen Dmitri Elena Fatima Goran Hana Ivan Jorge "
              "Keiko Lucia Mateo Nadia Omar Priya Rahul Sofia Tomas Ursula Vera William Ximena Yara Zain Aisha "
              "Bruno Camille Diego Eva Farid Greta Hugo Ingrid Jonas Kofi Leila Marco Nora Oscar Pedro Rania Sven "
              "Thea Uma Viktor Wei Yuki Anika Boris Clara Daniel Esther Felix Gloria Hassan Isabel Julia").split(),
    "held_out": ("Lena Ayodele Bartholomew Cosima Dagny Eamon Finnegan Gwendolyn Hamid Ines Jarrah Kalani "
                 "Lorenzo Mireille Nkechi Oleander Piotr Rafferty Saoirse Thaddeus Ulrike Valentin Wilhelmina "
                 "Xiomara Yevgeny Zuzana Anouk Bertrand Chiamaka Desmond").split(),
}
LAST_NAMES = {
    "train": ("Smith Jones Brown Garcia Miller Davis Wilson Taylor Clark Lewis Walker Young King Wright Lopez "
              "Hill Green Baker Adams Nelson Carter Mitchell Perez Roberts Turner Phillips Campbell Parker Evans "
              "Edwards Novak Kowalski Schmidt Weber Rossi Bianchi Silva Santos Tanaka Sato Kim Park Nguyen Singh "
              "Patel Khan Ivanov Petrov Jensen Larsen Dubois Moreau Fischer Wagner Costa Ferrari Ali Hassan "
              "Mensah Okoye Haddad Lindqvist Horvath Nagy Popescu Yilmaz Demir Murphy Kelly Byrne").split(),
    "held_out": ("Okafor Fairweather Castellanos Vuković Abernathy Zielinski Montgomery Achterberg Oyelaran "
                 "Rasmussen Quintero Delacroix Thorsen Bergkamp Iwasaki Mbeki Halloran Sandoval Kuznetsova "
                 "Pemberton Strandberg Villanueva Wojcik Amundsen Ferreira Lachance Nakamura Brennan").split(),
}
PARTICLES = ["van", "von", "van der", "ter", "bin", "al", "dos"]  # multi-part surnames
COMPANIES = {
    "train": ("Acme Globex Initech Umbrella Hooli Vandelay Stark Wayne Wonka Cyberdyne Soylent Tyrell Aperture "
              "Massive Oscorp Nakatomi Gringotts Monarch Duff Northwind Contoso Fabrikam Tailspin Litware Adatum "
              "Proseware Wingtip Lamna Fourthwall Yonder Zenith Polaris Quantum Kestrel Halcyon").split(),
    "held_out": ("Brightwater Parkside Nimbus Ironclad Sunfield Lumen Corvid Silverline Meridian Oakridge Bluefin "
                 "Kintsugi Harborview Greenleaf Thornbury").split(),
}
COMPANY_SUFFIXES = {"train": ["", "", "", " Ltd", " Inc.", " GmbH"], "held_out": ["", " Group", " AG", " LLC"]}
MAIL_HOSTS = {  # e-mail domains without the company ones
    "train": ["example.com", "mail.test", "inbox.example.org", "postbox.net", "corp.example.net", "webmail.io",
              "letters.info", "fastmail.eu"],
    "held_out": ["mailbox.io", "post.example.dev", "courrier.fr", "postfach.de", "mail.example.co.uk",
                 "inbox.ch"],
}
TLDS = ("com org net io co info eu us biz app me es it se pl at be ca cz dk fi gr ie jp mx no nz pt ro sg sk tr "
        "za shop online tech store cloud email co.nz com.au").split()  # both splits: a top-level domain is no format
MAIL_TAGS = ["news", "shop", "orders", "work", "2024", "support"]
ROLE_MAILBOXES = ["support", "billing", "info", "orders", "help.desk", "accounts"]

# the families only held-out rows use: "kind:family", kind being a dict above or a slot format of
# `vela2.train.synthetic` (person, email, phone, detail)
HELD_OUT = frozenset({
    "intent:frames-new", "intent:broken", "intent:late-parcel", "intent:login", "intent:no-more",
    "sentiment:adj-new", "sentiment:feel-new", "sentiment:fyi",
    "topic:statement", "topic:update", "topic:booking", "topic:meal", "toxicity:insult-new", "toxicity:threat-new",
    "intro:intro-new", "signoff:signoff-new", "email_lead:drop", "phone_lead:dial",
    "person:initial", "person:apostrophe", "person:unseen",
    "email:first-digits", "email:hyphen", "email:last-first-tag",
    "phone:no", "phone:fr", "phone:au", "phone:us-space",
    "detail:case",
})
