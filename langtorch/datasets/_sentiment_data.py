"""The langtorch sentiment sentences: written for this project, released with it (Apache-2.0).

One line per example: ``<label> <domain> | <text>`` with label ``+`` (positive) or ``-``
(negative). Mixed-feeling sentences carry the label of their overall verdict; sarcasm is labelled
by what the writer means, not by its surface words. Kept as a Python module (not a data file) so
it always ships inside the wheel.
"""

RAW = r"""
+ products | This blender crushes ice in seconds and it is quieter than my old one.
+ products | I was skeptical about the price, but these headphones are worth every penny.
+ products | The laptop boots in under ten seconds and the keyboard feels wonderful.
+ products | Not a single complaint after two years of daily use.
+ products | The battery easily lasts two days, which I did not expect from such a small phone.
+ products | My kids love this tablet and it survived being dropped down the stairs.
+ products | Assembly took ten minutes and the desk feels rock solid.
+ products | The camera is a bit heavy, but the photos it takes are stunning.
+ products | I can't stop recommending this vacuum to my friends.
+ products | It's not the cheapest kettle around, yet it boils fast and looks great on the counter.
+ products | These running shoes are the most comfortable pair I have ever owned.
+ products | The charger is compact and powers my laptop and phone at the same time, brilliant.
+ products | Honestly, I expected to return it, but the mattress fixed my back pain within a week.
+ products | The instructions were confusing; still, once set up, the printer has been flawless.
+ products | Sturdy, light and beautifully designed, this backpack is a keeper.
+ products | I never thought a coffee grinder could make such a difference to my mornings.
+ products | The smartwatch tracks my sleep accurately and the strap doesn't irritate my skin.
+ products | For the money you can't beat this drill, it handles brick without any trouble.
+ products | No more tangled cables: this wireless speaker just works.
+ products | The jacket kept me dry through a full day of rain in the mountains.
+ products | The frying pan heats evenly and nothing sticks, even eggs.
+ products | Delivery was slow, but the monitor itself is gorgeous and color accurate.
+ products | I bought a second one for my parents because the first was so good.
+ products | The e-reader screen is easy on the eyes and the battery lasts for weeks.
+ products | Not flashy, not expensive, just a reliable toaster that does its job perfectly.
+ products | The noise cancelling on these earbuds made my commute bearable again.
+ products | I was worried the sofa would look cheap, but it looks even better than in the photos.
+ products | My old router dropped the connection every hour; this one hasn't dropped it once.
+ products | The suitcase wheels glide smoothly and the zipper feels indestructible.
+ products | What a relief to find a phone case that is slim and actually protects the phone.
+ products | The knife set is razor sharp and the handles fit nicely in my hand.
+ products | It took a while to learn the settings, and now I wouldn't trade this camera for anything.
+ products | Great value, quick setup and a friendly little manual, I am impressed.
+ products | The plant lamp brought my dying basil back to life.
+ products | Comfortable, breathable and it still looks new after fifty washes.
+ products | The electric toothbrush is a small luxury that I now can't live without.
+ products | Five stars, the robot vacuum maps the whole flat and never gets stuck.
+ products | Even my picky teenager admits the new gaming chair is fantastic.
+ products | The lens is sharp from edge to edge and focuses in a flash.
+ products | It isn't perfect, the lid squeaks a little, but I love this lunch box.
+ products | The keyboard's soft click is so satisfying that I type more than ever.
+ products | Cheap plastic on the outside, solid engineering on the inside; I'm a fan.
+ products | I doubted a budget tripod could be steady, and I was happily proven wrong.
- products | The blender started leaking after the third use.
- products | These headphones are uncomfortable and the sound is muddy.
- products | The laptop overheats whenever I open more than two browser tabs.
- products | Oh great, another charger that stops working after a week.
- products | The phone looks sleek, but the battery dies before lunch.
- products | I wanted to like this tablet, yet the screen is dim and the speakers crackle.
- products | The desk arrived with missing screws and a cracked leg.
- products | Not worth the money; the vacuum barely picks up crumbs.
- products | The kettle's plastic smell never went away, even after a dozen boils.
- products | These shoes fell apart after two weeks of light walking.
- products | Absolutely love how the printer jams every single time I'm in a hurry.
- products | The backpack strap snapped on the first trip.
- products | I don't understand the good reviews, the coffee grinder is loud and uneven.
- products | The smartwatch loses connection to my phone several times a day.
- products | The drill is powerful, but the battery won't hold a charge, so it's useless.
- products | The speaker sounds tinny and distorts at half volume.
- products | The so-called waterproof jacket soaked through in light drizzle.
- products | The pan's coating started peeling within a month.
- products | The monitor had three dead pixels right in the middle.
- products | Customer reviews promised durability; mine broke on day two.
- products | The e-reader freezes when I turn pages quickly.
- products | A toaster that burns one side and leaves the other side raw, brilliant design.
- products | The earbuds keep falling out and the case won't close properly.
- products | The sofa cushions flattened within a few weeks.
- products | The router's app is a maze and the signal doesn't reach the bedroom.
- products | One wheel of the suitcase broke off at the airport on its first trip.
- products | The phone case is so thick that the buttons no longer work.
- products | The knives were dull straight out of the box.
- products | The camera's menus are a nightmare and the autofocus hunts constantly.
- products | Nice color, terrible fabric; the shirt shrank after one wash.
- products | I regret buying this lamp; it flickers and buzzes all night.
- products | The toothbrush head rattles and the battery lasts only three days.
- products | The robot vacuum got stuck under the couch every single day.
- products | The gaming chair creaks loudly whenever I lean back.
- products | It's not terrible, but it's definitely not worth twice the price of its rivals.
- products | The lunch box leaked soup all over my bag.
- products | The keyboard looked premium in the photos and feels like a toy in person.
- products | Returned it the same day: the fan is louder than a hair dryer.
- products | Wow, a mouse that double clicks on its own, just what I needed.
- products | I wouldn't call the build quality acceptable, let alone good.
- products | The lid never seals properly, so the coffee goes cold in minutes.
- products | Packaging was lovely, but the watch inside was scratched and slow.
- products | The app requires an account, a subscription and constant updates, for a scale.
+ food | The pasta was cooked perfectly and the sauce tasted homemade.
+ food | We went for the cheap lunch menu and left completely delighted.
+ food | The curry was spicy in the best possible way.
+ food | The dessert was so good that we ordered a second one to share.
+ food | Not a fancy place, but the soup warmed me up and tasted like my grandmother's.
+ food | The staff was rushed, but the food made up for it.
+ food | Fresh bread, crisp salad and a perfectly grilled fish, what more could I want.
+ food | I'm not usually a fan of tofu, yet this dish changed my mind.
+ food | The coffee here is rich and smooth, and the barista remembers my order.
+ food | The tacos were bursting with flavor and the salsa had a lovely kick.
+ food | Our waiter suggested a wine that matched the lamb beautifully.
+ food | Best pizza crust I've had outside of Naples.
+ food | The portions were small, but every bite was delicious.
+ food | The vegan burger was juicy, and nobody at the table believed it had no meat.
+ food | It's never crowded, the prices are fair, and the dumplings are fantastic.
+ food | The chocolate cake was moist and not too sweet.
+ food | I didn't expect much from an airport café, but the sandwich was excellent.
+ food | The ramen broth was deep and savory, worth the wait in line.
+ food | Everything on the tasting menu surprised us in a good way.
+ food | The bakery's croissants are flaky and buttery, a morning treat.
+ food | The sushi was fresh and the chef clearly cares about every piece.
+ food | Kind service, cozy room and a stew I still think about.
+ food | The meal kit recipes are simple and the ingredients arrive fresh.
+ food | The ice cream tastes like real strawberries.
+ food | We celebrated my mother's birthday here and the staff made it special.
+ food | The salad didn't look like much, but the dressing was outstanding.
+ food | The steak was cooked exactly as requested and the fries were crispy.
+ food | A hidden gem with honest cooking and generous plates.
+ food | The tea selection is wonderful and the scones are warm and fresh.
+ food | I could eat their falafel every day and never get tired of it.
+ food | The food truck's noodles beat most restaurants in town.
+ food | The wait was long, yet the brunch was absolutely worth it.
+ food | The cheese plate was generous and thoughtfully paired with honey and nuts.
+ food | Delivery arrived early and still piping hot.
+ food | Nothing fancy, just perfectly seasoned roast chicken.
+ food | The cocktails were creative and balanced, not sugary at all.
+ food | The kids' menu is healthy and my children actually ate everything.
+ food | Although the decor is dated, the seafood is the freshest in the city.
+ food | I can't remember the last time a simple omelette tasted this good.
+ food | Friendly owners, great espresso, and the pastries are baked every morning.
+ food | The spicy wings were addictive, I'll be back next week.
+ food | Who knew a hospital cafeteria could serve such a lovely lentil soup?
- food | The pasta was overcooked and swimming in oil.
- food | We waited an hour for cold soup.
- food | The curry had no flavor besides salt.
- food | The dessert looked pretty but tasted like sweet cardboard.
- food | Oh sure, twenty dollars for a plain sandwich, what a bargain.
- food | The waiter was lovely, but the food was inedible.
- food | The fish smelled off and the salad was wilted.
- food | I don't think the chef has ever tasted their own sauce.
- food | The coffee was burnt and the milk was sour.
- food | The tacos fell apart and the tortillas were stale.
- food | They forgot half of our order and charged us for all of it.
- food | The pizza was soggy in the middle and burnt at the edges.
- food | The portions are big, but quantity can't hide how bland everything was.
- food | The burger was dry and the bun was stale.
- food | The dumplings were gummy and filled with mystery meat.
- food | The cake was so sweet that my teeth hurt after one bite.
- food | Airport food at its worst: a soggy, overpriced wrap.
- food | The ramen was lukewarm and the noodles were mushy.
- food | The tasting menu felt like an expensive joke.
- food | The croissants were hard, as if baked yesterday.
- food | The sushi rice was cold and crumbly and the fish tasted frozen.
- food | The room was lovely and the service kind, yet I left hungry and disappointed.
- food | Half the ingredients in the meal kit were missing or spoiled.
- food | The ice cream was icy and tasted artificial.
- food | Nobody checked on our table for forty minutes.
- food | I found a hair in my salad and the manager just shrugged.
- food | The steak I ordered medium rare came out grey and chewy.
- food | It's not the worst meal I've had, but I won't be going back.
- food | The tea was weak and the scones were dry as dust.
- food | The falafel tasted reheated and the pita was torn.
- food | Gave me food poisoning, so that's memorable at least.
- food | The brunch was overpriced and the eggs were rubbery.
- food | The cheese plate was tiny and the bread was stale.
- food | The delivery arrived an hour late and completely cold.
- food | The chicken was raw in the middle, which is frankly dangerous.
- food | The cocktails tasted like syrup with a splash of cheap vodka.
- food | The kids' menu is nothing but fried food and sugar.
- food | The seafood platter smelled so bad we sent it back.
- food | Lovely view, shame about the greasy, tasteless food.
- food | The espresso was watery and the pastries were clearly from a supermarket.
- food | I've had better wings from a gas station.
- food | Ten out of ten for the music, zero for the food.
+ travel | The hotel staff upgraded our room and left a cake for our anniversary.
+ travel | Our flight landed early and the crew was cheerful the whole way.
+ travel | The beach was clean, quiet and absolutely beautiful.
+ travel | The hostel was basic, but spotless and full of friendly travelers.
+ travel | Our guide knew every story about the old town and made history come alive.
+ travel | The train was on time, comfortable and had excellent views.
+ travel | I wasn't expecting much from the village, and it ended up being the highlight of our trip.
+ travel | The hike to the waterfall was tough but rewarding.
+ travel | The room was small, yet the view of the harbor made up for everything.
+ travel | Check-in took two minutes and the bed was incredibly comfortable.
+ travel | The ferry ride at sunset was magical.
+ travel | Our cabin in the woods was cozy, quiet and well stocked.
+ travel | The city's public transport is cheap, fast and easy to use.
+ travel | Despite the rain, we had a wonderful time exploring the museums.
+ travel | The cruise food was excellent and the shows were surprisingly good.
+ travel | Never had such a relaxing holiday, I want to go back next year.
+ travel | The host met us at the station and gave us great tips for dinner.
+ travel | The airline lost my bag, but they delivered it to the hotel within hours and apologized sincerely.
+ travel | The ski slopes were well groomed and the lift lines were short.
+ travel | The campsite had clean showers and a stunning view of the lake.
+ travel | The road trip along the coast was the best week of my summer.
+ travel | The apartment was exactly as described and in a perfect location.
+ travel | Even the long layover was pleasant thanks to the airport's quiet lounge.
+ travel | The tour was not rushed at all, we had time to enjoy every stop.
+ travel | The resort's spa was heavenly.
+ travel | Locals were welcoming and happy to help us with directions.
+ travel | The bike rental was cheap and the trails were well marked.
+ travel | Our window seat on the night train came with a sky full of stars.
+ travel | The guesthouse breakfast was homemade and generous.
+ travel | It's a long flight, but the seats had plenty of legroom and the movies were good.
+ travel | The snorkeling trip showed us turtles and rays, unforgettable.
+ travel | The travel agent found us a last-minute deal that was better than we hoped.
+ travel | The old castle tour was fascinating and not crowded at all.
+ travel | The hotel was quiet even though it was right in the city center.
+ travel | The weather was grey, but the people and the food made it a great trip.
+ travel | Our honeymoon villa was private, peaceful and romantic.
+ travel | The boat captain was funny and made the whole day a joy.
+ travel | I've never slept so well in a hotel bed.
+ travel | The pool was warm, the drinks were cold and the staff was attentive.
+ travel | Not a single delay on six connecting trains, impressive.
+ travel | The mountain hut was simple, warm and the soup after the climb was perfect.
- travel | The hotel room smelled of smoke and the sheets were stained.
- travel | Our flight was delayed six hours with no explanation.
- travel | The beach was covered in trash and the water was murky.
- travel | The hostel was loud all night and the lockers were broken.
- travel | Our guide read from his phone and rushed us through every site.
- travel | Fantastic, another train cancellation, my favorite way to spend a Sunday.
- travel | The village was charming, but our rental was damp, dark and overpriced.
- travel | The hike was badly marked and we got lost for three hours.
- travel | The room was nothing like the photos, tiny and facing a wall.
- travel | Check-in took over an hour and the receptionist was rude.
- travel | The ferry was overcrowded and half the passengers were seasick.
- travel | The cabin had no hot water and mice in the kitchen.
- travel | The city's buses never come on time and nobody sells tickets.
- travel | The museums were closed and nobody told us.
- travel | The cruise was a floating shopping mall with bland food.
- travel | I needed a holiday to recover from this holiday.
- travel | The host canceled our booking the night before we arrived.
- travel | The airline lost my luggage and never answered my emails.
- travel | The ski resort was so crowded that we spent more time in lines than on the slopes.
- travel | The campsite showers were filthy and the toilets were broken.
- travel | The coastal road was beautiful, but our rental car broke down twice.
- travel | The apartment was in a noisy street and the heating didn't work.
- travel | The layover turned into an overnight stay on an airport bench.
- travel | The tour crammed five cities into three days, exhausting and pointless.
- travel | The spa was dirty and the massage was painful.
- travel | The locals were friendly, but the hotel staff treated us like a nuisance.
- travel | The bikes we rented had flat tires and no brakes.
- travel | The night train was freezing and the bunks were filthy.
- travel | The breakfast buffet was stale bread and watery coffee.
- travel | The seats didn't recline and the entertainment system was broken for the entire flight.
- travel | The snorkeling trip was canceled and they refused to refund us.
- travel | The travel agent booked the wrong dates and blamed us.
- travel | Paying forty euros to queue for three hours at the castle, what a treat.
- travel | The hotel advertised a quiet location next to a nightclub.
- travel | Rain we could handle; the rude staff and dirty room we could not.
- travel | The honeymoon suite turned out to be a regular room with a few rose petals.
- travel | The boat smelled of fuel and the captain shouted at everyone.
- travel | The mattress was so thin that I could feel every spring.
- travel | The pool was closed for repairs for our entire stay.
- travel | Not one of our trains left on time, and two never showed up.
- travel | The view was nice, I suppose, if you like parking lots.
+ media | The movie's ending gave me chills and I still think about it.
+ media | A slow start, but the second half of the novel is gripping.
+ media | The soundtrack is gorgeous and fits every scene.
+ media | I laughed out loud through the whole episode.
+ media | The documentary explains a complicated topic clearly without talking down to you.
+ media | The acting was uneven, but the story was so moving that I didn't care.
+ media | This album gets better with every listen.
+ media | The game's puzzles are clever and the art style is charming.
+ media | I didn't expect a children's film to make me cry, but it did, in the best way.
+ media | The podcast hosts are funny, well prepared and never drag on.
+ media | A sequel that is better than the original, rare and wonderful.
+ media | The plot twists were surprising yet made perfect sense.
+ media | Every chapter ended on a hook and I finished the book in one night.
+ media | The special effects are not cutting-edge, but the characters feel real.
+ media | The concert was loud, joyful and worth the long trip.
+ media | The series finale tied up every loose end beautifully.
+ media | The poems are short, sharp and surprisingly tender.
+ media | I've watched this comedy five times and it still makes me laugh.
+ media | The theatre production was bold, inventive and brilliantly acted.
+ media | The graphic novel's drawings are breathtaking.
+ media | Not a boring minute in this two-and-a-half-hour film.
+ media | The biography is thorough, fair and a pleasure to read.
+ media | The indie game was short, but it's one of the most memorable things I've played.
+ media | The jazz trio played with so much warmth that the room fell silent.
+ media | The cinematography alone is worth the ticket.
+ media | The lead actress delivers the performance of her career.
+ media | Never thought a show about accountants could be this entertaining.
+ media | The mystery kept me guessing until the last page.
+ media | A gentle, funny film that left the whole family smiling.
+ media | The remaster looks and sounds fantastic.
+ media | Some jokes miss, but most land and the cast has great chemistry.
+ media | The exhibition was thoughtfully curated and inspiring.
+ media | The audiobook narrator gives every character a distinct and lively voice.
+ media | The band's new single is catchy without being shallow.
+ media | The animation is stunning and the story has real heart.
+ media | It's quiet, slow and completely beautiful.
+ media | The horror film was genuinely scary without relying on cheap jump scares.
+ media | I didn't like the first season, but the second won me over completely.
+ media | A smart, funny script and a soundtrack I've already added to my playlist.
+ media | The documentary changed the way I think about food.
+ media | Clever dialogue, memorable characters and a satisfying ending.
- media | The movie was two hours of loud noises and no story.
- media | The novel started strong and then collapsed into nonsense.
- media | The soundtrack was so loud that I couldn't hear the dialogue.
- media | Not a single joke in the episode made me smile.
- media | The documentary was one-sided and full of errors.
- media | The effects were impressive, but the script was lazy and the acting wooden.
- media | The album sounds like the same song played twelve times.
- media | The game crashes constantly and the controls are clumsy.
- media | What a masterpiece, I only checked my phone forty times.
- media | The podcast is an hour of the hosts talking over each other.
- media | A sequel nobody asked for and nobody will remember.
- media | The plot twist was obvious from the first five minutes.
- media | I forced myself to finish the book and regretted it.
- media | The characters were flat and their decisions made no sense.
- media | The concert started two hours late and the sound was awful.
- media | The series finale betrayed everything the show had built.
- media | The poems felt like random sentences broken into lines.
- media | The comedy tried so hard to be edgy that it was just mean.
- media | The theatre production was pretentious and painfully long.
- media | The graphic novel's art is pretty, but the story goes nowhere.
- media | Three hours of my life that I will never get back.
- media | The biography reads like a press release.
- media | The indie game's ideas are nice on paper, yet playing it is tedious.
- media | The band played for only forty minutes and seemed bored.
- media | Beautiful shots can't save a film with nothing to say.
- media | The lead actor mumbles through every scene.
- media | The show wasn't funny, wasn't clever and wasn't even short.
- media | The mystery's solution was a cheap trick.
- media | The kids were bored and so were we.
- media | The remaster somehow looks worse than the original.
- media | Great cast, wasted on a script full of clichés.
- media | The exhibition had more empty walls than art.
- media | The audiobook narrator reads in a flat monotone that put me to sleep.
- media | The new single is forgettable background noise.
- media | The animation is cheap and the jokes are aimed at nobody.
- media | Oh good, another superhero movie that ends with a sky portal.
- media | The horror film was more silly than scary.
- media | I gave it three episodes and it never got better.
- media | The script is smug and the soundtrack is grating.
- media | The documentary promised answers and delivered an advertisement.
- media | I really wanted to love this movie, but it was a mess.
+ services | The plumber arrived on time, fixed the leak and cleaned up after himself.
+ services | Customer support answered within minutes and solved my problem.
+ services | The bank's new app is fast and the transfers are instant.
+ services | My hairdresser listened carefully and the cut is exactly what I wanted.
+ services | The mechanic explained the issue honestly and charged less than the estimate.
+ services | The insurance claim was handled quickly and without any hassle.
+ services | The movers were careful with our furniture and finished early.
+ services | The dentist was gentle and patient with my nervous son.
+ services | I was on hold for a while, but the agent who answered was brilliant.
+ services | The cleaning service left our flat sparkling.
+ services | The courier called ahead and delivered the parcel right to my door.
+ services | The gym's trainers are encouraging and the equipment is well maintained.
+ services | Our internet provider fixed the outage faster than they promised.
+ services | The vet took time to answer all our questions and was kind to our old dog.
+ services | The tax advisor saved me more money than she charged.
+ services | The streaming service has a great catalogue and rarely buffers.
+ services | Not cheap, but the electrician did a careful and thorough job.
+ services | The pharmacy staff noticed a drug interaction my doctor had missed.
+ services | The tailor fixed my suit in a day and it fits perfectly now.
+ services | The library staff helped me find a rare book in another city.
+ services | The landlord responds to every request within a day.
+ services | The language school's teachers are patient and the classes are fun.
+ services | I hate phone calls, but the online chat solved my issue in five minutes.
+ services | The car wash made my ten-year-old car look new.
+ services | The wedding photographer captured moments we didn't even notice.
+ services | The repair shop replaced my phone screen while I waited.
+ services | Refund processed in two days, no questions asked.
+ services | The nurse was attentive, warm and explained everything.
+ services | The gardeners transformed our messy yard into a lovely space.
+ services | The locksmith came at midnight and charged a fair price.
+ services | The post office queue was long, but it moved quickly and the clerk was kind.
+ services | The tutoring sessions raised my daughter's math grade and her confidence.
+ services | The hotel concierge booked us a table at a restaurant that was supposedly full.
+ services | The software support team actually read my ticket before replying, amazing.
+ services | Our accountant catches every mistake and explains things in plain language.
+ services | The dry cleaner removed a wine stain I thought was permanent.
+ services | Fast, friendly and fairly priced, I'll use this laundry service again.
+ services | The physiotherapist got me back to running in a month.
+ services | The phone company cut my bill after I asked, no drama at all.
+ services | The bike shop fixed my gears for free because it took only a minute.
+ services | The clinic's appointment system is simple and reminders arrive on time.
- services | The plumber never showed up and never called.
- services | Customer support kept me on hold for two hours and then hung up.
- services | The bank's app logs me out every time I switch screens.
- services | My hairdresser ignored everything I said and cut it far too short.
- services | The mechanic charged me for parts he never replaced.
- services | The insurance company found a new excuse every week to delay my claim.
- services | The movers broke a lamp and scratched the table, then denied it.
- services | The dentist rushed through the appointment and billed me twice.
- services | I love being transferred between five departments who each ask for my account number.
- services | The cleaners skipped the bathroom entirely.
- services | The courier left my parcel in the rain and marked it as delivered.
- services | The gym is always overcrowded and half the machines are broken.
- services | Our internet goes down every evening and support blames our router.
- services | The vet was friendly, but the bill was outrageous and the treatment didn't work.
- services | The tax advisor made an error that cost me a fine.
- services | The streaming service keeps raising prices while removing shows.
- services | The electrician left exposed wires in the wall.
- services | The pharmacy lost my prescription twice.
- services | The tailor shortened my trousers by three inches too many.
- services | The library's online system is down more often than it's up.
- services | The landlord ignored our broken heating for a month in winter.
- services | The language school canceled half the classes and kept the fees.
- services | The chatbot kept answering a question I never asked.
- services | The car wash left swirl marks all over the paint.
- services | The photographer delivered blurry photos six months late.
- services | The repair shop kept my laptop for three weeks and it's still broken.
- services | Still waiting for my refund, eight weeks and counting.
- services | The nurse was kind, but the hospital lost my test results.
- services | The gardeners trampled the flower beds and left their rubbish behind.
- services | The locksmith quoted fifty and charged three hundred.
- services | The post office clerk was rude and sent my letter to the wrong country.
- services | The tutor spent the sessions on his phone.
- services | The concierge recommended a restaurant that had closed years ago.
- services | Thanks for closing my ticket without reading it, very helpful.
- services | Our accountant missed a deadline and didn't tell us.
- services | The dry cleaner ruined my favorite coat and offered a coupon.
- services | The laundry service lost two of my shirts.
- services | The physiotherapist's exercises made my knee worse.
- services | The phone company doubled my bill without any notice.
- services | It's not that the service is slow, it's that it doesn't exist.
- services | The clinic canceled my appointment by text an hour before.
"""
